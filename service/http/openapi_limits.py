"""The OpenAPI schema states the limits the server really enforces.

Request models carry the fixed bounds (k >= 1, finite numbers...); the limits that come from
settings (max_k, max_text_chars, ...) and from the model (the embedding dimension) are checked
in the routes and written into the served schema here, so that every request the schema
calls valid is one the server accepts. The one rule JSON Schema cannot state, shortlist >= k,
is in the field's description and in the 422 response.

The metrics a request may name depend on the index versions being served (a metric needs its
index family, or the candidate metric's), so the schema is regenerated from the loaded
versions on every request for it; it is cheap.
"""

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from models.networks.model_config import ConfigError, ModelConfig
from models.settings import Settings
from service.http.schemas import add_body_schemas

SEARCH_PATHS = ("/search/text", "/search/image", "/search/embedding")
NON_BLANK = r"\S"  # at least one character that is not whitespace
BASE64 = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
SHORTLIST_RULE = (
    "Candidates re-ranked exactly; default max(10*k, 100). Must be >= k (a 422 otherwise)."
)


def install_openapi_limits(app: FastAPI, settings: Settings) -> None:
    """Make app.openapi() return the generated schema with the configured limits applied."""

    def openapi() -> dict[str, Any]:
        schema = get_openapi(
            title=app.title, version=app.version, summary=app.summary, routes=app.routes
        )
        add_body_schemas(schema)
        apply_limits(schema, settings, _model_config(settings))
        services = getattr(app.state, "services", None)
        if services is not None:
            apply_metrics(schema, _served_metrics(services))
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def apply_limits(
    schema: dict[str, Any], settings: Settings, config: ModelConfig | None = None
) -> None:
    """Write the settings' limits (and the model's widths) into the search request bodies of
    an OpenAPI schema."""
    dim = config.embed_dim if config is not None else None
    for path in SEARCH_PATHS:
        operation = schema["paths"].get(path, {}).get("post")
        if operation is None:
            continue
        for content_type, media in operation["requestBody"]["content"].items():
            body = _resolve(schema, media["schema"])
            _limit_options(body["properties"], settings, form=content_type.startswith("multi"))
            _limit_payload(body["properties"], settings, dim)
            if "features" in body["properties"]:
                _limit_vectors(body, config)
    items = schema["paths"].get("/v1/items", {}).get("post")
    if items is not None:
        body = _resolve(schema, items["requestBody"]["content"]["application/json"]["schema"])
        _limit_payload(body["properties"], settings, dim)
        body["oneOf"] = _item_contents(body, config)


def apply_metrics(schema: dict[str, Any], metrics: dict[str, list[str]]) -> None:
    """Restrict `metric` to those available per searched gallery (both, for /search/embedding,
    which names its gallery in the body). A gallery without a loaded version is left open."""
    searched = {"/search/text": ["image"], "/search/image": ["text"],
                "/search/embedding": ["image", "text"]}  # fmt: skip
    for path, galleries in searched.items():
        if not all(g in metrics for g in galleries):
            continue
        allowed = [m for m in metrics[galleries[0]] if all(m in metrics[g] for g in galleries)]
        operation = schema["paths"].get(path, {}).get("post")
        for media in operation["requestBody"]["content"].values() if operation else ():
            props = _resolve(schema, media["schema"])["properties"]
            _constrain(props, "metric", enum=allowed)


def _served_metrics(services: Any) -> dict[str, list[str]]:
    return {
        loaded.modality: services.searcher.available_metrics(loaded)
        for loaded in services.holder.loaded()
    }


def _limit_options(props: dict[str, Any], settings: Settings, form: bool) -> None:
    _constrain(props, "k", maximum=settings.max_k)
    _constrain(props, "shortlist", maximum=settings.max_shortlist)
    _constrain(props, "mc_samples", maximum=settings.max_mc_samples)
    if "shortlist" in props:
        props["shortlist"]["description"] = SHORTLIST_RULE
    if form:  # a form field cannot be null: it is left out instead
        for prop in props.values():
            branches = [b for b in prop.pop("anyOf", []) if b.get("type") != "null"]
            if branches:
                prop.update(branches[0])


def _limit_payload(props: dict[str, Any], settings: Settings, dim: int | None) -> None:
    _constrain(props, "text", maxLength=settings.max_text_chars, pattern=NON_BLANK)
    _constrain(props, "image_base64", pattern=BASE64)
    length = {"minItems": dim, "maxItems": dim} if dim else {"maxItems": settings.max_embedding_dim}
    for name in ("mu", "logvar"):
        _constrain(props, name, **length)


def _limit_vectors(body: dict[str, Any], config: ModelConfig | None) -> None:
    """Backbone vectors: refused by a model without backbones, so the schema then offers
    mu and logvar only; else a caption's vector (to search the image gallery) and an image's
    (the caption gallery) each have their backbone's width."""
    if config is None or not config.pretrained:
        body["properties"].pop("features")
        body["oneOf"] = [{"required": ["mu", "logvar"]}]
        return
    vectors = [
        {
            "required": ["features", "gallery"],
            "properties": {
                "gallery": {"const": gallery},
                "features": {
                    "minItems": config.backbone_dim(kind),
                    "maxItems": config.backbone_dim(kind),
                },
            },
        }
        for gallery, kind in (("image", "text"), ("text", "image"))
    ]
    body["oneOf"] = [{"required": ["mu", "logvar"]}, *vectors]


ITEM_CONTENTS = ("text", "image_base64", "mu", "logvar", "features")


def _item_contents(body: dict[str, Any], config: ModelConfig | None) -> list[dict[str, Any]]:
    """POST /v1/items takes exactly one content, and the gallery it implies or names: a
    caption (text gallery), a picture (image gallery), a Gaussian or a backbone vector of the
    gallery's own modality (a model on backbones only)."""

    def only(*names: str, gallery: str | None = None, required: tuple[str, ...] = ()):
        others = [{"required": [n]} for n in ITEM_CONTENTS if n not in names]
        branch: dict[str, Any] = {"required": [*names, *required], "not": {"anyOf": others}}
        if gallery is not None:
            branch["properties"] = {"gallery": {"const": gallery}}
        return branch

    contents = [
        only("text", gallery="text"),
        only("image_base64", gallery="image"),
        only("mu", "logvar", required=("gallery",)),
    ]
    if config is None or not config.pretrained:
        body["properties"].pop("features", None)
        return contents
    for gallery in ("image", "text"):
        width = config.backbone_dim(gallery)
        branch = only("features", gallery=gallery, required=("gallery",))
        branch["properties"]["features"] = {"minItems": width, "maxItems": width}
        contents.append(branch)
    return contents


def _constrain(props: dict[str, Any], name: str, **keywords: Any) -> None:
    """Add JSON Schema keywords to property `name` (to its non-null branch if nullable)."""
    if name not in props:
        return
    prop = props[name]
    for branch in prop.get("anyOf", [prop]):
        if branch.get("type") != "null":
            branch.update(keywords)


def _resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    if ref is None:
        return node
    name = ref.rsplit("/", 1)[-1]
    return schema["components"]["schemas"][name]


def _model_config(settings: Settings) -> ModelConfig | None:
    """The served model's config (its embedding dimension, every gallery's D, and its
    backbones' widths), or None without a readable model."""
    try:
        return ModelConfig.load(settings.model)
    except (ConfigError, OSError, ValueError):
        return None
