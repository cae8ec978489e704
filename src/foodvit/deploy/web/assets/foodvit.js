// The foodvit page: a photo is decoded by the browser, then three ONNX graphs run in ONNX Runtime Web
// (WebAssembly, one thread): preprocess.onnx (resize, centre crop, normalisation, as foodvit's Python
// predictor), model.onnx (logits and the attention rollout), overlay.onnx (the map over the crop).
// This script only decodes, calls the graphs and shows the answer; it holds no preprocessing arithmetic.
// Every failure is one line in #error; every wait has a time limit, so the page never hangs.
"use strict";

const DECODE_TIMEOUT_MS = 30000;
const MODEL_TIMEOUT_MS = 60000;
const $ = (id) => document.getElementById(id);
const state = {
  config: null, sessions: null, loading: null, queue: Promise.resolve(),
  answers: 0, loadMs: null, last: null, crop: null,
};
window.foodvit = state;  // what a test or a benchmark reads

class PhotoError extends Error {}

function withTimeout(promise, ms, what) {
  let timer;
  const limit = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new PhotoError(`${what} took over ${ms / 1000} s; try a smaller photo`)), ms);
  });
  return Promise.race([promise, limit]).finally(() => clearTimeout(timer));
}

function showError(message) {
  $("error").textContent = message;
  $("error").hidden = false;
  document.body.dataset.state = "error";
}

function clearError() {
  $("error").hidden = true;
  $("error").textContent = "";
}

function megapixels(pixels) {
  return String(Math.round(pixels / 1e5) / 10);
}

// the photo's size from its header (an <img> loads without decoding every pixel), or a PhotoError
function dimensions(blob, name, accepted) {
  return new Promise((resolve, reject) => {
    const url = URL.createObjectURL(blob);
    const img = new Image();
    img.onload = () => { URL.revokeObjectURL(url); resolve([img.naturalWidth, img.naturalHeight]); };
    img.onerror = () => {
      URL.revokeObjectURL(url);
      reject(new PhotoError(`${name} is not an image this browser can read; expected ${accepted}`));
    };
    img.src = url;
  });
}

// the photo as the Python predictor decodes it: turned upright by its EXIF orientation, colours as stored
// (no colour management), transparency over white; RGBA bytes (H, W, 4)
async function decode(blob, name) {
  const limits = state.config.limits;
  if (blob.size === 0) throw new PhotoError(`${name} is empty (0 bytes); expected ${limits.accepted}`);
  if (blob.size > limits.max_file_mb * 1e6) {
    const mb = (blob.size / 1e6).toFixed(1);
    throw new PhotoError(`${name} is ${mb} MB, over the page's limit of ${limits.max_file_mb} MB; send a smaller one`);
  }
  const header = dimensions(blob, name, limits.accepted);
  const [width, height] = await withTimeout(header, DECODE_TIMEOUT_MS, `reading ${name}`);
  if (width * height > limits.max_megapixels * 1e6) {
    throw new PhotoError(`${name} is ${width} x ${height} = ${megapixels(width * height)} megapixels, over the page's `
                         + `limit of ${limits.max_megapixels} megapixels; resize it below the limit and try again`);
  }
  // foodvit predict's rule and words (photos.py's too_long): a strip of pixels scaled to the model would need gigabytes
  const [long, short] = [Math.max(width, height), Math.max(Math.min(width, height), 1)];
  if (long > limits.max_aspect * short) {
    throw new PhotoError(`${name} is ${width} x ${height} px, ${(long / short).toFixed(0)} times as long as it is wide `
                         + `(at most ${limits.max_aspect}); crop it closer to what it shows and try again`);
  }
  let bitmap;
  try {
    const options = { imageOrientation: "from-image", colorSpaceConversion: "none", premultiplyAlpha: "none" };
    bitmap = await withTimeout(createImageBitmap(blob, options), DECODE_TIMEOUT_MS, `decoding ${name}`);
  } catch (err) {
    if (err instanceof PhotoError) throw err;
    throw new PhotoError(`${name} cannot be decoded, damaged or truncated? `
                         + `expected a complete image file: ${limits.accepted}`);
  }
  const canvas = document.createElement("canvas");
  canvas.width = bitmap.width;
  canvas.height = bitmap.height;
  const context = canvas.getContext("2d", { willReadFrequently: true });
  context.fillStyle = "#ffffff";
  context.fillRect(0, 0, canvas.width, canvas.height);
  context.drawImage(bitmap, 0, 0);
  bitmap.close();
  const pixels = context.getImageData(0, 0, canvas.width, canvas.height).data;
  const bytes = new Uint8Array(pixels.buffer, pixels.byteOffset, pixels.length);
  return new ort.Tensor("uint8", bytes, [canvas.height, canvas.width, 4]);
}

function softmax(logits) {
  const top = Math.max(...logits);
  const e = Array.from(logits, (x) => Math.exp(x - top));
  const sum = e.reduce((a, b) => a + b, 0);
  return e.map((x) => x / sum);
}

async function classify(blob, name) {
  const { preprocess, model, overlay } = state.sessions;
  const started = performance.now();
  const pixels = await decode(blob, name);
  const decoded = performance.now();
  const prepared = await withTimeout(preprocess.run({ pixels }), MODEL_TIMEOUT_MS, "preprocessing");
  const outputs = await withTimeout(model.run({ images: prepared.images }), MODEL_TIMEOUT_MS, "the model");
  const answered = performance.now();
  const probabilities = softmax(outputs.logits.data);
  const grid = state.config.grid;
  const heat = new ort.Tensor("float32", outputs.attention.data.slice(0, grid * grid), [grid, grid]);
  const drawn = await withTimeout(overlay.run({ crop: prepared.crop, heat }), MODEL_TIMEOUT_MS, "the overlay");
  state.crop = prepared.crop.data;  // what the model saw (S, S, 3): a test compares it with Python's crop
  return { name, probabilities, overlay: drawn.overlay, decodeMs: decoded - started, modelMs: answered - decoded,
           totalMs: performance.now() - started };
}

function show(answer) {
  const classes = state.config.classes;
  const order = classes.map((c, i) => i).sort((a, b) => answer.probabilities[b] - answer.probabilities[a]);
  const list = $("classes");
  list.replaceChildren(...order.map((i) => {
    const item = document.createElement("li");
    item.dataset.label = classes[i];
    item.dataset.probability = String(answer.probabilities[i]);
    item.textContent = `${classes[i]}: ${answer.probabilities[i].toFixed(3)}`;
    const bar = document.createElement("div");
    bar.className = "bar";
    bar.style.width = `${(100 * answer.probabilities[i]).toFixed(1)}%`;
    item.append(bar);
    return item;
  }));
  $("timing").textContent = `${answer.name}: the model took ${answer.modelMs.toFixed(0)} ms `
                            + "(preprocessing and forward pass); "
                            + `${answer.totalMs.toFixed(0)} ms with decoding and drawing`;
  const size = state.config.preprocess.image_size;
  const canvas = $("overlay");
  canvas.width = size;
  canvas.height = size;
  const data = answer.overlay.data;
  const rgba = new Uint8ClampedArray(data.buffer, data.byteOffset, data.length);
  canvas.getContext("2d").putImageData(new ImageData(rgba, size, size), 0, 0);
  $("attention").hidden = false;
  state.answers += 1;
  state.last = { name: answer.name, label: classes[order[0]],
                 probabilities: Object.fromEntries(classes.map((c, i) => [c, answer.probabilities[i]])),
                 modelMs: answer.modelMs, totalMs: answer.totalMs, decodeMs: answer.decodeMs };
  document.body.dataset.answers = String(state.answers);
  document.body.dataset.state = "done";
}

// the answer shown is the last photo's: a new photo, or an error, takes the previous one away
function clearAnswer() {
  $("classes").replaceChildren();
  $("timing").textContent = "";
  $("attention").hidden = true;
  state.last = null;
}

// one photo at a time, in the order given; a failure is one line and the page goes on
function submit(blob, name) {
  state.queue = state.queue.then(async () => {
    await state.loading;  // a photo given while the model loads waits for it
    if (!state.sessions) return;  // the model did not load: its error line stays, saying why
    clearError();
    clearAnswer();
    document.body.dataset.state = "busy";
    $("status").textContent = `classifying ${name}...`;
    try {
      show(await classify(blob, name));
      $("status").textContent = "ready";
    } catch (err) {
      $("status").textContent = "ready";
      showError(err instanceof PhotoError ? err.message
                                          : `${name} could not be classified (${err && err.message || err})`);
    }
  });
  return state.queue;
}

function fromInput(input) {
  input.addEventListener("change", () => {
    const file = input.files && input.files[0];
    if (file) submit(file, file.name || "the photo");
    input.value = "";
  });
}

function examples() {
  const holder = $("examples");
  for (const path of state.config.examples) {
    const button = document.createElement("button");
    button.type = "button";
    button.title = decodeURIComponent(path.split("/").pop());
    const img = document.createElement("img");
    img.src = path;
    img.alt = `example: ${button.title}`;
    button.append(img);
    button.addEventListener("click", async () => {
      try {
        const response = await fetch(path);
        submit(await response.blob(), button.title);
      } catch (err) {
        showError(`${button.title} could not be loaded (${err.message})`);
      }
    });
    holder.append(button);
  }
}

function card() {
  const rows = $("card-rows");
  for (const [name, text] of state.config.card) {
    const dt = document.createElement("dt");
    dt.textContent = name;
    const dd = document.createElement("dd");
    dd.textContent = text;
    rows.append(dt, dd);
  }
}

async function start() {
  if (location.protocol === "file:") {
    showError("this page must be served over HTTP: browsers do not load WebAssembly from file://; "
              + "run `python -m http.server` in its folder and open http://localhost:8000/");
    $("status").textContent = "not loaded";
    return;
  }
  const started = performance.now();
  try {
    state.config = await (await fetch("foodvit.json")).json();
    for (const input of [$("photo"), $("camera")]) input.accept = state.config.limits.types.join(",");
    document.title = state.config.title;
    $("title").textContent = state.config.title;
    card();
    examples();
    ort.env.wasm.numThreads = 1;  // threads need cross-origin isolation, which a plain static host does not give
    ort.env.wasm.wasmPaths = new URL("ort/", location.href).href;
    const options = { executionProviders: ["wasm"] };
    const [preprocess, model, overlay] = await Promise.all(
      ["preprocess.onnx", "model.onnx", "overlay.onnx"].map((f) => ort.InferenceSession.create(f, options)));
    // one blank photo through all three, as the server warms up: the first visitor's photo waits no longer than others
    const size = state.config.preprocess.image_size;
    const pixels = new ort.Tensor("uint8", new Uint8Array(size * size * 4), [size, size, 4]);
    const blank = await preprocess.run({ pixels });
    const first = await model.run({ images: blank.images });
    const grid = state.config.grid;
    const heat = new ort.Tensor("float32", first.attention.data.slice(0, grid * grid), [grid, grid]);
    await overlay.run({ crop: blank.crop, heat });
    state.sessions = { preprocess, model, overlay };
    state.loadMs = performance.now() - started;
    $("status").textContent = `model loaded in ${state.loadMs.toFixed(0)} ms: ready`;  // fetched, compiled, warmed up
    document.body.dataset.state = "ready";
  } catch (err) {
    $("status").textContent = "not loaded";
    const why = err && err.message || err;
    showError(`the model could not be loaded (${why}); serve this folder over HTTP with all its files`);
  }
}

fromInput($("photo"));
fromInput($("camera"));
const drop = $("drop");
drop.addEventListener("dragover", (event) => { event.preventDefault(); drop.classList.add("over"); });
drop.addEventListener("dragleave", () => drop.classList.remove("over"));
drop.addEventListener("drop", (event) => {
  event.preventDefault();
  drop.classList.remove("over");
  const file = event.dataTransfer.files[0];
  if (file) submit(file, file.name || "the dropped photo");
});
state.loading = start();
