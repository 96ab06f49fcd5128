"""Scene sampling and rendering of the shapes dataset: seeded, exactly known content."""

from __future__ import annotations

import colorsys
import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from PIL import Image, ImageDraw

IMAGE_SIZE = 64
SUPERSAMPLE = 4  # objects are drawn at 4x and box-filtered down: anti-aliased edges
# Fully saturated object colours; backgrounds are kept at saturation <= 0.15 so that no
# background can be mistaken for an object colour.
COLORS: dict[str, tuple[int, int, int]] = {
    "red": (215, 25, 30),
    "green": (30, 160, 50),
    "blue": (30, 70, 215),
    "yellow": (240, 205, 15),
    "purple": (135, 35, 175),
    "orange": (245, 125, 10),
}
SHAPES: tuple[str, ...] = ("circle", "square", "triangle", "diamond", "star")
SIZES: dict[str, tuple[float, float]] = {"small": (5.0, 7.0), "large": (10.0, 13.0)}  # radius px
BACKGROUNDS: tuple[str, ...] = ("solid", "gradient", "noise")
MIN_VISIBLE = 0.6  # every object keeps at least this fraction of its area unoccluded
MAX_OBJECTS = 4


@dataclass(frozen=True)
class SceneObject:
    """One object: attributes a caption can name plus its exact geometry."""

    shape: str
    color: str
    size: str
    center: tuple[float, float]  # x, y in pixels
    radius: float  # half of the object's extent, pixels
    rotation: float  # degrees (triangle and star only; squares and diamonds stay upright)


@dataclass(frozen=True)
class Background:
    """A background recipe: kind, two low-saturation colours, gradient angle, noise seed."""

    kind: str
    color_a: tuple[int, int, int]
    color_b: tuple[int, int, int]
    angle: float
    noise_seed: int


@dataclass(frozen=True)
class Scene:
    """Everything needed to re-render one image exactly."""

    background: Background
    objects: tuple[SceneObject, ...]
    visible: tuple[float, ...]  # fraction of each object's area left unoccluded


def scene_rng(seed: int, index: int, stream: int) -> np.random.Generator:
    """Independent generator for one image and purpose (0 background, 1 objects, 2 captions)."""
    return np.random.default_rng([seed, index, stream])


def sample_scene(seed: int, index: int) -> Scene:
    """The scene of image `index` of the dataset with this seed (pure function of both)."""
    background = _sample_background(scene_rng(seed, index, 0))
    objects, visible = _sample_objects(scene_rng(seed, index, 1))
    return Scene(background, objects, visible)


def _pale_color(rng: np.random.Generator) -> tuple[int, int, int]:
    hue, sat, val = rng.uniform(0, 1), rng.uniform(0, 0.15), rng.uniform(0.2, 0.92)
    return tuple(round(255 * c) for c in colorsys.hsv_to_rgb(hue, sat, val))


def _sample_background(rng: np.random.Generator) -> Background:
    kind = BACKGROUNDS[rng.integers(len(BACKGROUNDS))]
    return Background(
        kind=str(kind),
        color_a=_pale_color(rng),
        color_b=_pale_color(rng),
        angle=float(rng.uniform(0, 2 * math.pi)),
        noise_seed=int(rng.integers(2**31)),
    )


def _sample_objects(rng: np.random.Generator) -> tuple[tuple[SceneObject, ...], tuple[float, ...]]:
    """1..4 objects placed so that each stays visible and same-coloured ones never touch."""
    count = int(rng.integers(1, MAX_OBJECTS + 1))
    for attempt in range(400):
        if attempt % 20 == 0:  # after 20 failed layouts, draw new attributes as well
            attributes = [_sample_attributes(rng) for _ in range(count)]
        objects = tuple(_place(rng, shape, color, size) for shape, color, size in attributes)
        if _same_colors_apart(objects):
            visible = visible_fractions(objects)
            if min(visible) >= MIN_VISIBLE:
                return objects, visible
    raise RuntimeError("could not place the objects of a scene")  # unreachable in practice


def _sample_attributes(rng: np.random.Generator) -> tuple[str, str, str]:
    shape = SHAPES[rng.integers(len(SHAPES))]
    color = list(COLORS)[rng.integers(len(COLORS))]
    size = list(SIZES)[rng.integers(len(SIZES))]
    return shape, color, size


def _place(rng: np.random.Generator, shape: str, color: str, size: str) -> SceneObject:
    radius = float(rng.uniform(*SIZES[size]))
    low, high = radius + 1.0, IMAGE_SIZE - 1.0 - radius
    center = (float(rng.uniform(low, high)), float(rng.uniform(low, high)))
    rotation = float(rng.uniform(0, 360)) if shape in ("triangle", "star") else 0.0
    return SceneObject(shape, color, size, center, radius, rotation)


def _same_colors_apart(objects: tuple[SceneObject, ...]) -> bool:
    """Objects of one colour must not touch (two red circles must not merge into one blob)."""
    for i, a in enumerate(objects):
        for b in objects[i + 1 :]:
            if a.color == b.color and math.dist(a.center, b.center) < a.radius + b.radius + 2:
                return False
    return True


def _polygon(obj: SceneObject, scale: float) -> list[tuple[float, float]]:
    """Vertices of a polygonal shape, in pixels of an image `scale` times the base size."""
    cx, cy, r = obj.center[0] * scale, obj.center[1] * scale, obj.radius * scale
    if obj.shape == "square":
        h = 0.85 * r
        return [(cx - h, cy - h), (cx + h, cy - h), (cx + h, cy + h), (cx - h, cy + h)]
    if obj.shape == "diamond":
        w = 0.65 * r
        return [(cx, cy - r), (cx + w, cy), (cx, cy + r), (cx - w, cy)]
    points, radii = (3, (r,)) if obj.shape == "triangle" else (5, (r, 0.45 * r))
    step = 2 * math.pi / (points * len(radii))
    start = math.radians(obj.rotation) - math.pi / 2
    return [
        (cx + radii[k % len(radii)] * math.cos(start + k * step),
         cy + radii[k % len(radii)] * math.sin(start + k * step))
        for k in range(points * len(radii))
    ]  # fmt: skip


@lru_cache(maxsize=64)
def coverage(obj: SceneObject) -> np.ndarray:
    """(H, W) float32 in [0, 1]: fraction of each pixel the object covers (anti-aliased).

    Cached (objects are frozen): sampling, rendering and the bbox share one drawing. The
    returned array is read-only.
    """
    big = IMAGE_SIZE * SUPERSAMPLE
    mask = Image.new("L", (big, big), 0)
    draw = ImageDraw.Draw(mask)
    if obj.shape == "circle":
        cx, cy, r = (v * SUPERSAMPLE for v in (*obj.center, 0.95 * obj.radius))
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=255)
    else:
        draw.polygon(_polygon(obj, SUPERSAMPLE), fill=255)
    alpha = np.asarray(mask.reduce(SUPERSAMPLE), dtype=np.float32) / 255.0  # (H, W)
    alpha.flags.writeable = False
    return alpha


def visible_fractions(objects: tuple[SceneObject, ...]) -> tuple[float, ...]:
    """Fraction of each object's area not covered by the objects drawn after it."""
    alphas = [coverage(o) for o in objects]
    fractions = []
    for i, alpha in enumerate(alphas):
        visible = alpha.copy()
        for later in alphas[i + 1 :]:
            visible *= 1.0 - later
        fractions.append(float(visible.sum() / max(alpha.sum(), 1e-6)))
    return tuple(fractions)


def render_background(background: Background) -> np.ndarray:
    """(H, W, 3) float32 RGB in [0, 255]."""
    a = np.array(background.color_a, dtype=np.float32)
    b = np.array(background.color_b, dtype=np.float32)
    if background.kind == "solid":
        return np.broadcast_to(a, (IMAGE_SIZE, IMAGE_SIZE, 3)).copy()
    coords = (np.arange(IMAGE_SIZE, dtype=np.float32) + 0.5) / IMAGE_SIZE - 0.5
    ys, xs = np.meshgrid(coords, coords, indexing="ij")  # (H, W) each
    if background.kind == "gradient":
        t = xs * math.cos(background.angle) + ys * math.sin(background.angle)
        t = (t - t.min()) / max(float(t.max() - t.min()), 1e-6)  # (H, W) in [0, 1]
        return a + t[..., None] * (b - a)
    rng = np.random.default_rng(background.noise_seed)
    coarse = rng.normal(0.0, 1.0, size=(8, 8)).astype(np.float32)
    smooth = np.asarray(
        Image.fromarray(coarse, mode="F").resize((IMAGE_SIZE, IMAGE_SIZE), Image.Resampling.BICUBIC)
    )
    fine = rng.normal(0.0, 1.0, size=(IMAGE_SIZE, IMAGE_SIZE)).astype(np.float32)
    luminance = 18.0 * smooth + 6.0 * fine  # (H, W): grey noise keeps the saturation low
    return np.clip(a + luminance[..., None], 0.0, 255.0)


def render_scene(scene: Scene, keep: tuple[int, ...] | None = None) -> Image.Image:
    """The RGB image of a scene; `keep` draws only those objects (in their original order)."""
    canvas = render_background(scene.background)  # (H, W, 3)
    for i, obj in enumerate(scene.objects):
        if keep is not None and i not in keep:
            continue
        alpha = coverage(obj)[..., None]  # (H, W, 1)
        color = np.array(COLORS[obj.color], dtype=np.float32)
        canvas = canvas * (1.0 - alpha) + color * alpha
    return Image.fromarray(np.round(canvas).astype(np.uint8), mode="RGB")


def object_bbox(obj: SceneObject) -> tuple[int, int, int, int]:
    """Inclusive pixel box (x0, y0, x1, y1) of the object's covered pixels."""
    ys, xs = np.nonzero(coverage(obj) > 0.0)
    return int(xs.min()), int(ys.min()), int(xs.max()), int(ys.max())
