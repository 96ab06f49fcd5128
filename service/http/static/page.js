// The search page: queries the service's own JSON API and draws the answer. No dependencies.
"use strict";

const K_CHOICES = [5, 10, 20, 50, 100];
const GALLERY_NAMES = { image: "image index", text: "caption index" };
const SCORE_NAMES = {
  mutual_information: "mutual information",
  log_det: "vagueness (log det)",
  unknown_words: "share of unknown words",
};
// What each reject score measures, in a sentence for someone who never met the word: the page
// explains the score the service actually rejects with (query.reject_score.name), no other.
const EXPLAIN = {
  novelty: "This picture looks unlike anything the model was trained on: its backbone sees " +
    "it farther from every training picture than almost all of them are from each other.",
  log_det: "The model is unsure what this query shows or says: its reading of the query is " +
    "spread out far more widely than usual.",
  top_mahalanobis: "Even the best result does not fit the query: it lies further from what the " +
    "query describes than the things it describes usually do.",
  mutual_information: "The model cannot make up its mind: run several times with small random " +
    "changes (MC dropout), it ranks the results differently each time.",
  posterior_entropy: "Many results look about equally good, so the top ones are close to a guess.",
  entropy: "The query is vague: the model's reading of it is spread out widely.",
  feature_uncertainty: "The model's reading of the query moves a lot between repeated runs " +
    "with small random changes (MC dropout).",
  unknown_words: "Most words of this query are words the model never met in training, so it " +
    "cannot tell what the query asks for.",
  out_of_range: "This query lies so far from every item of the gallery that they are all about " +
    "equally far from it: no result is closer to it than any other.",
};

const state = { config: null, lastQuery: null };
const ADMIN_KEY_STORAGE = "probsearch-admin-key"; // sessionStorage only: gone with the tab
const $ = (id) => document.getElementById(id);

function element(tag, props = {}, children = []) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else node.setAttribute(key, value);
  }
  for (const child of children) node.append(child);
  return node;
}

// A number as people read it: three significant digits (278.8619279107541 is 279).
function format(value) {
  if (value === null || value === undefined || Number.isNaN(value)) return "n/a";
  const abs = Math.abs(value);
  if (abs !== 0 && (abs < 1e-3 || abs >= 1e5)) return value.toExponential(2);
  return Number(value.toPrecision(3)).toString();
}

// ----- talking to the API -------------------------------------------------------------------

async function callApi(path, init) {
  let response;
  try {
    response = await fetch(path, init);
  } catch (error) {
    throw new Error(`The service could not be reached (${error.message}). Is it still running?`);
  }
  const body = await response.text();
  let parsed = null;
  try {
    parsed = body ? JSON.parse(body) : null;
  } catch (_) {
    parsed = null;
  }
  if (!response.ok) {
    const detail = parsed && parsed.detail ? readableDetail(parsed.detail) : body.slice(0, 300) || response.statusText;
    const error = new Error(`The service answered ${response.status}: ${detail}`);
    error.status = response.status;
    error.detail = detail;
    throw error;
  }
  if (parsed === null) throw new Error("The service sent an answer that is not JSON.");
  return parsed;
}

// FastAPI's validation errors are a list of {loc, msg}: written as "filter.labels: msg".
function readableDetail(detail) {
  if (typeof detail === "string") return detail;
  if (Array.isArray(detail)) {
    return detail
      .map((item) => {
        const where = (item.loc || []).filter((part) => part !== "body").join(".");
        return where ? `${where}: ${item.msg}` : item.msg;
      })
      .join("; ");
  }
  return JSON.stringify(detail);
}

async function loadConfig() {
  try {
    state.config = await callApi("/v1/config");
  } catch (error) {
    $("footer-info").textContent = error.message;
    showError(error.message);
    return;
  }
  fillSelectors(state.config);
  showFooter(state.config);
}

function defaultMetricLabel(config) {
  const forCaption = config.default_metrics.image;
  const forImage = config.default_metrics.text;
  if (forCaption === forImage) return `default (${forCaption})`;
  return `default (${forCaption} for a caption, ${forImage} for an image)`;
}

function fillSelectors(config) {
  const metric = $("metric");
  const chosenMetric = metric.value;
  metric.replaceChildren(
    element("option", { value: "", text: defaultMetricLabel(config) }),
    ...config.metrics.map((name) => element("option", { value: name, text: name }))
  );
  metric.value = chosenMetric;
  const k = $("k");
  const chosenK = k.value || String(config.default_k);
  const choices = [...new Set([...K_CHOICES, config.default_k])]
    .filter((n) => n <= config.max_k)
    .sort((a, b) => a - b);
  k.replaceChildren(
    ...choices.map((n) => element("option", { value: String(n), text: n === config.default_k ? `${n} (default)` : String(n) }))
  );
  k.value = chosenK;
}

function showFooter(config) {
  const parts = [`Model ${config.model}`];
  for (const [gallery, summary] of Object.entries(config.galleries)) {
    parts.push(`${GALLERY_NAMES[gallery] || gallery} ${summary.version} (${summary.count} items)`);
  }
  if (Object.keys(config.galleries).length === 0) parts.push("no index loaded yet");
  $("footer-info").textContent = parts.join(" · ");
}

function searchOptions() {
  const options = { k: Number($("k").value) || undefined, metric: $("metric").value || undefined };
  const threshold = $("reject-threshold").value.trim();
  if (threshold !== "") options.reject_threshold = Number(threshold);
  const filter = readFilterBox();
  if (filter !== null) options.filter = filter;
  return options;
}

// ----- the filter box -----------------------------------------------------------------------

// A mistake in the filter box, told in a sentence before anything is sent.
class FilterSyntaxError extends Error {}

const FIELD_NAME = /^[A-Za-z0-9_-]{1,64}$/;
const NUMBER = /^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$/;
const RANGE_OPS = { ">=": "gte", "≥": "gte", ">": "gt", "<=": "lte", "≤": "lte", "<": "lt" };
const CONDITION = /^([^:=<>≤≥!]+?)\s*(>=|<=|==|≥|≤|>|<|=|:)\s*(.*)$/s;

// The filter box's text as the request's `filter` (null when empty). People write conditions
// such as "labels: red circle; split: test; index >= 10" (";" or new lines between them, all
// must hold; "a, b" or "a or b" for either value); a JSON object is sent as it is.
function parseFilter(text) {
  const source = text.trim();
  if (!source) return null;
  if (source.startsWith("{")) return parseJsonFilter(source);
  const filter = {};
  for (const raw of source.split(/[;\n]+/)) {
    const part = raw.trim();
    if (part) addCondition(filter, part);
  }
  return Object.keys(filter).length ? filter : null;
}

function parseJsonFilter(source) {
  let parsed;
  try {
    parsed = JSON.parse(source);
  } catch (error) {
    throw new FilterSyntaxError(`it starts with “{” but is not valid JSON (${error.message}).`);
  }
  if (parsed === null || typeof parsed !== "object" || Array.isArray(parsed)) {
    throw new FilterSyntaxError('a JSON filter must be an object, such as {"split": "test"}.');
  }
  return parsed;
}

function addCondition(filter, part) {
  const match = part.match(CONDITION);
  if (!match) {
    throw new FilterSyntaxError(
      `“${part}” is not a condition. Write field: value (such as split: test) or a field ` +
        "compared with a number (such as index >= 10)."
    );
  }
  const [, rawField, op, rawValue] = match;
  const field = rawField.trim();
  const value = rawValue.trim();
  if (!FIELD_NAME.test(field)) {
    throw new FilterSyntaxError(
      `“${field}” is not a field name: use id, or a field of the items such as split or ` +
        "labels (letters, digits, _ and - only)."
    );
  }
  if (!value) throw new FilterSyntaxError(`“${part}” has no value after “${op}”.`);
  if (op in RANGE_OPS) {
    addBound(filter, field, RANGE_OPS[op], value, part);
    return;
  }
  if (field in filter) {
    throw new FilterSyntaxError(
      `${field} is given twice. For either of several values write them in one condition, ` +
        `such as ${field}: a, b.`
    );
  }
  const values = value.split(/\s*,\s*|\s+or\s+/i).filter((v) => v !== "").map((v) => filterValue(field, v));
  if (values.length === 0) throw new FilterSyntaxError(`“${part}” has no value after “${op}”.`);
  filter[field] = values.length === 1 ? values[0] : { in: values };
}

function addBound(filter, field, op, value, part) {
  if (!NUMBER.test(value)) {
    throw new FilterSyntaxError(`“${part}”: a comparison needs a number, such as ${field} >= 10.`);
  }
  const existing = filter[field];
  if (existing !== undefined && !isRange(existing)) {
    throw new FilterSyntaxError(`${field} is given both a value and a comparison; keep one of them.`);
  }
  const bounds = existing || {};
  const clash = op.startsWith("g") ? ["gte", "gt"] : ["lte", "lt"];
  if (clash.some((name) => name in bounds)) {
    throw new FilterSyntaxError(`${field} has two ${op.startsWith("g") ? "lower" : "upper"} bounds; keep one.`);
  }
  bounds[op] = Number(value);
  filter[field] = bounds;
}

function isRange(condition) {
  return condition !== null && typeof condition === "object" && !("in" in condition);
}

// One value as JSON: "quoted" text stays text, 3 and 2.5 are numbers, true/false booleans;
// an id is always text (ids are strings).
function filterValue(field, text) {
  const quoted = text.match(/^"(.*)"$/s) || text.match(/^'(.*)'$/s);
  if (quoted) return quoted[1];
  if (field === "id") return text;
  if (NUMBER.test(text)) return Number(text);
  if (/^(true|false)$/i.test(text)) return text.toLowerCase() === "true";
  return text;
}

// The box's filter; a mistake is shown (and marked on the box) by run's error handling.
function readFilterBox() {
  const box = $("filter");
  try {
    const filter = parseFilter(box.value);
    box.removeAttribute("aria-invalid");
    return filter;
  } catch (error) {
    if (!(error instanceof FilterSyntaxError)) throw error;
    box.setAttribute("aria-invalid", "true");
    throw new Error(`The filter could not be read: ${error.message}`);
  }
}

// A 422 about the filter reads as one: the backend's messages name the filter.
function filterRefusal(error, sentFilter) {
  if (!sentFilter || error.status !== 422 || !/filter/i.test(error.detail || "")) return error;
  $("filter").setAttribute("aria-invalid", "true");
  return new Error(`The service refused the filter: ${error.detail}`);
}

function matchedSentence(matched) {
  if (matched === null || matched === undefined) return "";
  if (matched === 0) return "No item matches the filter.";
  return matched === 1 ? "1 item matches the filter." : `${matched} items match the filter.`;
}

async function searchJson(path, body) {
  try {
    return await callApi(path, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
    });
  } catch (error) {
    throw filterRefusal(error, body.filter);
  }
}

function textRequest(text) {
  return {
    kind: "text",
    label: `“${text}”`,
    send: () => searchJson("/search/text", { text, ...searchOptions() }),
  };
}

// Standard base64 of a file's bytes (for the JSON form of /search/image).
async function base64Of(file) {
  const bytes = new Uint8Array(await file.arrayBuffer());
  let binary = "";
  for (let start = 0; start < bytes.length; start += 0x8000) {
    binary += String.fromCharCode(...bytes.subarray(start, start + 0x8000));
  }
  return btoa(binary);
}

function imageRequest(file) {
  return {
    kind: "image",
    label: `the image ${file.name}`,
    send: async () => {
      const options = searchOptions();
      if (options.filter !== undefined) {
        // A multipart form field holds text, not the filter's JSON object: send JSON.
        return searchJson("/search/image", { image_base64: await base64Of(file), ...options });
      }
      const form = new FormData();
      form.append("image", file);
      for (const [key, value] of Object.entries(options)) {
        if (value !== undefined) form.append(key, String(value));
      }
      return callApi("/search/image", { method: "POST", body: form });
    },
  };
}

async function run(query) {
  state.lastQuery = query;
  hideError();
  hideNotice();
  $("results").setAttribute("aria-busy", "true");
  $("status").textContent = `Searching for ${query.label}…`;
  try {
    const answer = await query.send();
    if (state.lastQuery !== query) return; // a newer query was sent meanwhile
    await refreshConfigFor(answer);
    showAnswer(query, answer);
  } catch (error) {
    if (state.lastQuery !== query) return;
    $("status").textContent = "";
    showError(error.message);
  } finally {
    $("results").removeAttribute("aria-busy");
  }
}

async function refreshConfigFor(answer) {
  const gallery = answer.query.modality === "text" ? "image" : "text";
  const known = state.config && state.config.galleries[gallery];
  if (!known || known.version !== answer.index_version) await loadConfig();
}

// ----- drawing the answer -------------------------------------------------------------------

function rejectScore(query) {
  const score = query.reject_score;
  if (score && score.value !== undefined) return score;
  return { name: "mutual_information", value: query.mutual_information, threshold: query.reject_threshold };
}

function showAnswer(query, answer) {
  showVerdict(answer.query);
  const galleryName = query.kind === "text" ? "image" : "text";
  const gallery = state.config ? state.config.galleries[galleryName] : null;
  const cards = answer.results.map((hit) => resultCard(hit, query.kind, gallery, answer.metric));
  $("grid").replaceChildren(...cards);
  $("grid").dataset.kind = query.kind;
  $("grid").dataset.gallery = galleryName;
  syncAdminControls();
  $("legend").hidden = cards.length === 0;
  const what = query.kind === "text" ? "images" : "captions";
  const found = cards.length
    ? `${cards.length} ${what} for ${query.label}, ranked by ${answer.metric} distance.`
    : `No ${what} found for ${query.label}.`;
  $("status").textContent = [found, matchedSentence(answer.matched)].filter(Boolean).join(" ");
}

function scoreName(name) {
  return SCORE_NAMES[name] || name.replaceAll("_", " ");
}

// Scores the answer marks as carrying no information for this query (query.uninformative):
// a posterior uniform over the shortlist, MC draws that were all the same.
function uninformative(queryInfo, name) {
  return (queryInfo.uninformative || []).includes(name);
}

function showVerdict(queryInfo) {
  const score = rejectScore(queryInfo);
  const name = scoreName(score.name);
  $("verdict").hidden = false;
  $("banner").hidden = !queryInfo.rejected;
  const reason = uninformative(queryInfo, score.name)
    ? ` It was refused by its ${name}, a score that carries no information for this query.`
    : `${EXPLAIN[score.name] || ""}` +
      ` Its ${name} ${format(score.value)} is above the threshold ${format(score.threshold)}.`;
  $("banner-detail").textContent = reason + " The results are shown below, but treat them with care.";
  drawGauge(score, name, queryInfo);
  showVagueness(queryInfo);
  showUnknownWords(queryInfo);
}

// The caption's words the model never met in training (query.unknown_words), and the caption
// with those a typo away from a known word corrected (query.did_you_mean), as a link.
function showUnknownWords(queryInfo) {
  const words = queryInfo.unknown_words || [];
  $("unknown-words").hidden = words.length === 0;
  $("unknown-words-list").textContent = words.join(", ");
  const suggestion = queryInfo.did_you_mean || "";
  $("did-you-mean").hidden = !suggestion;
  $("did-you-mean-link").textContent = suggestion;
}

function searchSuggestion(event) {
  event.preventDefault();
  const text = $("did-you-mean-link").textContent;
  if (!text) return;
  $("text").value = text;
  run(textRequest(text));
}

// The query's own vagueness (its log det), apart from the score the service rejects with.
function showVagueness(queryInfo) {
  const known = typeof queryInfo.log_det === "number";
  $("vagueness").hidden = !known;
  if (!known) return;
  $("vagueness-value").textContent = format(queryInfo.log_det);
}

// The gauge's scale [low, high]. With a positive threshold and score (MI, entropies) it runs
// from 0 to twice the threshold, so the threshold sits in the middle; a negative one (a
// log-det) is centred the same way, wide enough for the score. Without a threshold: MI's own
// upper bound ln(shortlist size), or a bit past the score.
function gaugeRange(score, queryInfo) {
  const { name, value, threshold } = score;
  const v = value || 0;
  if (threshold !== null && threshold !== undefined) {
    if (threshold > 0 && v >= 0) return [0, Math.max(2 * threshold, v)];
    const span = Math.max(Math.abs(threshold), Math.abs(v - threshold)) || 1;
    return [threshold - span, threshold + span];
  }
  if (name === "mutual_information" && queryInfo.shortlist_size > 1) {
    return [0, Math.log(queryInfo.shortlist_size)];
  }
  return v >= 0 ? [0, 1.25 * v || 1] : [1.25 * v, 0];
}

function drawGauge(score, name, queryInfo) {
  const { value, threshold } = score;
  const rejected = queryInfo.rejected;
  const gauge = $("gauge");
  const measured = value !== null && value !== undefined;
  const hasThreshold = threshold !== null && threshold !== undefined;
  const [low, high] = gaugeRange(score, queryInfo);
  const percent = (x) => Math.min(100, Math.max(0, (100 * (x - low)) / (high - low)));
  $("gauge-fill").hidden = !measured;
  $("gauge-fill").style.width = measured ? `${percent(value)}%` : "0%";
  $("gauge-mark").hidden = !hasThreshold;
  if (hasThreshold) $("gauge-mark").style.left = `${percent(threshold)}%`;
  gauge.classList.toggle("over", Boolean(rejected));
  gauge.setAttribute("aria-valuemin", String(low));
  gauge.setAttribute("aria-valuemax", String(high));
  gauge.setAttribute("aria-valuenow", String(measured ? value : 0));
  const empty = measured && uninformative(queryInfo, score.name);
  $("gauge-fill").hidden = !measured || empty;
  let text;
  if (!measured) text = `${name}: not measured for this query`;
  else if (empty) text = `${name}: carries no information for this query, so it is not shown`;
  else if (!hasThreshold) text = `${name} ${format(value)}; no threshold, so never rejected`;
  else text = `${name} ${format(value)} ${rejected ? "above" : "within"} the threshold ${format(threshold)}`;
  $("gauge-text").textContent = text;
  gauge.setAttribute("aria-valuetext", text);
  $("gauge-help").textContent =
    "The bar is the score the service rejects queries by, the line its threshold: past the " +
    `line the service does not trust its answer. The score here is ${name}; past the line it ` +
    `means: ${lowerFirst(EXPLAIN[score.name] || "The service is unsure of this query.")}`;
}

function lowerFirst(text) {
  return text.charAt(0).toLowerCase() + text.slice(1);
}

function uncertaintyBar(logDet, gallery) {
  let fraction = null;
  if (gallery && gallery.log_det_high > gallery.log_det_low) {
    fraction = (logDet - gallery.log_det_low) / (gallery.log_det_high - gallery.log_det_low);
    fraction = Math.min(1, Math.max(0, fraction));
  }
  const percent = fraction === null ? 0 : Math.round(100 * fraction);
  const tip = gallery
    ? `Uncertainty of this item: log det Σ = ${format(logDet)}. The bar places it in its ` +
      `gallery's range, from ${format(gallery.log_det_low)} (the most certain item, empty) ` +
      `to ${format(gallery.log_det_high)} (the least certain, full). A longer bar: the model ` +
      "is less sure what this item shows or says."
    : `Uncertainty of this item: log det Σ = ${format(logDet)}.`;
  const fill = element("span", { class: "uncertainty-fill" });
  fill.style.width = `${percent}%`;
  return element(
    "span",
    {
      class: "uncertainty",
      role: "meter",
      tabindex: "0",
      title: tip,
      "aria-label": "Item uncertainty",
      "aria-valuemin": "0",
      "aria-valuemax": "100",
      "aria-valuenow": String(percent),
      "aria-valuetext": `${percent}% of the gallery's range (log det ${format(logDet)})`,
      "data-percent": String(percent),
    },
    [fill, element("span", { class: "tooltip", role: "tooltip", text: tip })]
  );
}

function resultCard(hit, kind, gallery, metric) {
  const body =
    kind === "text"
      ? element("img", {
          class: "thumb",
          src: `/v1/items/${encodeURIComponent(hit.id)}/image`,
          alt: hit.metadata && hit.metadata.text ? hit.metadata.text : `Gallery image ${hit.id}`,
          loading: "lazy",
          decoding: "async",
        })
      : element("blockquote", { class: "caption", text: (hit.metadata && hit.metadata.text) || hit.id });
  const facts = element("div", { class: "facts" }, [
    element("span", { class: "rank", text: `#${hit.rank}` }),
    element("span", { class: "distance", title: `${metric} distance to the query; smaller is closer`, text: `d ${format(hit.distance)}` }),
    uncertaintyBar(hit.log_det, gallery),
  ]);
  const id = element("div", { class: "item-id", text: hit.id });
  const parts = [body, facts, id];
  // A picture the service would refuse as a query (query.results[].unfamiliar).
  if (hit.unfamiliar === true) {
    parts.push(element("div", {
      class: "item-unfamiliar",
      text: "Unlike the pictures the model was trained on: its distance means little.",
    }));
  }
  return element("li", { class: `card card-${kind}`, "data-id": hit.id }, parts);
}

// ----- messages -----------------------------------------------------------------------------

function showError(message) {
  $("error").textContent = message;
  $("error").hidden = false;
}

function hideError() {
  $("error").hidden = true;
  $("error").textContent = "";
}

function showNotice(message) {
  $("notice").textContent = message;
  $("notice").hidden = false;
}

function hideNotice() {
  $("notice").hidden = true;
  $("notice").textContent = "";
}

// ----- deleting from the gallery (admin users) ----------------------------------------------

function adminKey() {
  try {
    return sessionStorage.getItem(ADMIN_KEY_STORAGE) || "";
  } catch (_) {
    return ""; // storage disabled: the key lives in the field only
  }
}

function setAdminKey(key) {
  try {
    if (key) sessionStorage.setItem(ADMIN_KEY_STORAGE, key);
    else sessionStorage.removeItem(ADMIN_KEY_STORAGE);
  } catch (_) {
    // storage disabled: nothing to keep
  }
}

function currentKey() {
  return $("admin-key").value.trim() || adminKey();
}

// Each result card gets a delete button while an admin key is set, and loses it without one.
function syncAdminControls() {
  const enabled = currentKey() !== "";
  for (const card of $("grid").querySelectorAll("li.card")) {
    const controls = card.querySelector(".admin");
    if (enabled && !controls) card.append(adminControls(card));
    if (!enabled && controls) controls.remove();
  }
}

function galleryLabel(gallery) {
  return GALLERY_NAMES[gallery] || `${gallery} gallery`;
}

function adminControls(card) {
  const id = card.dataset.id;
  const button = element("button", {
    type: "button",
    class: "delete",
    "aria-label": `Delete from gallery: ${id}`,
    text: "Delete from gallery",
  });
  const box = element("div", { class: "admin" }, [button]);
  button.addEventListener("click", () => askToDelete(card, box));
  return box;
}

function askToDelete(card, box) {
  const id = card.dataset.id;
  const gallery = $("grid").dataset.gallery;
  const yes = element("button", { type: "button", class: "delete confirm-delete", text: "Yes, delete" });
  const no = element("button", { type: "button", class: "secondary cancel-delete", text: "Cancel" });
  const question = element("p", {
    class: "confirm-text",
    text: `Delete ${id} from the ${galleryLabel(gallery)} for everyone? This cannot be undone.`,
  });
  const group = element("div", { class: "confirm", role: "group", "aria-label": `Confirm deleting ${id}` }, [
    question,
    element("div", { class: "confirm-buttons" }, [yes, no]),
  ]);
  const cancel = () => {
    const fresh = adminControls(card);
    box.replaceWith(fresh);
    fresh.querySelector("button").focus();
  };
  no.addEventListener("click", cancel);
  group.addEventListener("keydown", (event) => {
    if (event.key === "Escape") cancel();
  });
  yes.addEventListener("click", () => deleteItem(card, box, gallery));
  box.replaceChildren(group);
  no.focus();
}

async function deleteItem(card, box, gallery) {
  const id = card.dataset.id;
  const key = currentKey();
  hideError();
  for (const button of box.querySelectorAll("button")) button.disabled = true;
  box.querySelector(".confirm-text").textContent = `Deleting ${id}…`;
  try {
    const done = await callApi(`/v1/items/${encodeURIComponent(id)}?gallery=${encodeURIComponent(gallery)}`, {
      method: "DELETE",
      headers: { "X-API-Key": key },
    });
    removeCard(card, `Deleted ${id} from the ${galleryLabel(gallery)}; ${done.live_items} items are left.`);
    loadConfig(); // the footer's item counts
  } catch (error) {
    if (error.status === 404) {
      removeCard(card, `${id} was no longer in the ${galleryLabel(gallery)}: it had been deleted already.`);
      return;
    }
    const fresh = adminControls(card);
    box.replaceWith(fresh);
    fresh.querySelector("button").focus();
    showError(deleteError(error, id));
  }
}

function deleteError(error, id) {
  if (error.status === 401 || error.status === 403) {
    return `The admin key was refused, so ${id} was not deleted (${error.status}): check the ` +
      `key under Advanced. The service said: ${error.detail}`;
  }
  if (error.status === 429) {
    return `Too many wrong admin keys were sent, so the service is refusing for a while ` +
      `(429): ${error.detail}`;
  }
  return `${id} could not be deleted. ${error.message}`;
}

// Takes a result off the list; the focus goes to the next result's delete button, or the list.
function removeCard(card, message) {
  const next = card.nextElementSibling || card.previousElementSibling;
  card.remove();
  showNotice(message);
  const target = next && next.querySelector(".admin button");
  if (target) target.focus();
  else $("results").focus();
  $("legend").hidden = $("grid").children.length === 0;
}

// ----- wiring -------------------------------------------------------------------------------

function chooseImage(file) {
  if (!file) return;
  const preview = $("query-preview");
  if (preview.src) URL.revokeObjectURL(preview.src);
  preview.src = URL.createObjectURL(file);
  preview.alt = `Your query image, ${file.name}`;
  preview.hidden = false;
  run(imageRequest(file));
}

function wire() {
  $("text-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const text = $("text").value.trim();
    if (text) run(textRequest(text));
  });
  $("did-you-mean-link").addEventListener("click", searchSuggestion);
  $("image").addEventListener("change", () => chooseImage($("image").files[0]));
  const zone = $("drop-zone");
  for (const type of ["dragenter", "dragover"]) {
    zone.addEventListener(type, (event) => {
      event.preventDefault();
      zone.classList.add("dragging");
    });
  }
  for (const type of ["dragleave", "drop"]) {
    zone.addEventListener(type, () => zone.classList.remove("dragging"));
  }
  zone.addEventListener("drop", (event) => {
    event.preventDefault();
    const file = event.dataTransfer.files[0];
    if (file) chooseImage(file);
  });
  for (const type of ["dragover", "drop"]) {
    // A file dropped beside the zone must not make the browser leave the page to show it.
    window.addEventListener(type, (event) => event.preventDefault());
  }
  for (const id of ["metric", "k"]) {
    $(id).addEventListener("change", () => state.lastQuery && run(state.lastQuery));
  }
  $("filter-form").addEventListener("submit", (event) => {
    event.preventDefault();
    if (state.lastQuery) run(state.lastQuery);
    else if ($("text").value.trim()) run(textRequest($("text").value.trim()));
    else {
      try {
        readFilterBox();
        hideError();
        $("status").textContent = "The filter applies to your next search.";
      } catch (error) {
        showError(error.message);
      }
    }
  });
  $("filter").addEventListener("input", () => $("filter").removeAttribute("aria-invalid"));
  const keyBox = $("admin-key");
  keyBox.value = adminKey();
  if (keyBox.value) keyBox.closest("details").open = true;
  keyBox.addEventListener("input", () => {
    setAdminKey(keyBox.value.trim());
    syncAdminControls();
  });
}

wire();
loadConfig();
