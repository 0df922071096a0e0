// lorahost console: charts from data-chart attributes, the upload drop zone with a progress bar, and the
// playground's two streams. No inline script anywhere (the Content-Security-Policy forbids it).
"use strict";

const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#65a30d",
  "#475569", "#ea580c"];

function csrfToken() {
  return document.body.dataset.csrf || "";
}

function drawCharts(root) {
  if (typeof Chart === "undefined") return;
  root.querySelectorAll("canvas[data-chart]").forEach((canvas) => {
    if (canvas.dataset.drawn) return;
    const config = JSON.parse(canvas.dataset.chart);
    config.data.datasets.forEach((dataset, i) => {
      const colour = PALETTE[i % PALETTE.length];
      dataset.borderColor = dataset.borderColor || colour;
      dataset.backgroundColor = dataset.backgroundColor || colour;
    });
    new Chart(canvas, config);
    canvas.dataset.drawn = "1";
  });
}

// ---- upload ------------------------------------------------------------------------------------------

function readEntry(entry, out) {
  // A dropped folder: its files, recursively (only base names are sent; the API takes the PEFT file names).
  return new Promise((resolve) => {
    if (entry.isFile) {
      entry.file((file) => { out.push(file); resolve(); }, () => resolve());
    } else if (entry.isDirectory) {
      const reader = entry.createReader();
      const all = [];
      const next = () => reader.readEntries((batch) => {
        if (!batch.length) { Promise.all(all.map((e) => readEntry(e, out))).then(resolve); return; }
        all.push(...batch); next();
      }, () => resolve());
      next();
    } else {
      resolve();
    }
  });
}

async function droppedFiles(dataTransfer) {
  const entries = [...dataTransfer.items].map((item) => item.webkitGetAsEntry && item.webkitGetAsEntry()).filter(Boolean);
  if (!entries.length) return [...dataTransfer.files];
  const out = [];
  await Promise.all(entries.map((e) => readEntry(e, out)));
  return out;
}

function setupUpload() {
  const form = document.getElementById("upload-form");
  if (!form) return;
  const zone = document.getElementById("dropzone");
  const input = document.getElementById("upload-files");
  const chosen = document.getElementById("upload-chosen");
  const progress = document.getElementById("upload-progress");
  const status = document.getElementById("upload-status");
  let files = [];
  const show = () => { chosen.textContent = files.map((f) => f.name).join(", "); };
  input.addEventListener("change", () => { files = [...input.files]; show(); });
  zone.addEventListener("dragover", (e) => { e.preventDefault(); zone.classList.add("over"); });
  zone.addEventListener("dragleave", () => zone.classList.remove("over"));
  zone.addEventListener("drop", async (e) => {
    e.preventDefault(); zone.classList.remove("over");
    files = await droppedFiles(e.dataTransfer); show();
  });
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    if (!files.length) { status.textContent = "Choose or drop the adapter's files first."; return; }
    const body = new FormData();
    ["name", "base_model", "visibility"].forEach((k) => body.append(k, form.elements[k].value));
    files.forEach((f) => body.append("files", f, f.name));
    const xhr = new XMLHttpRequest();
    xhr.open("POST", form.action);
    xhr.setRequestHeader("X-CSRF-Token", csrfToken());
    progress.hidden = false; progress.value = 0;
    xhr.upload.addEventListener("progress", (ev) => { if (ev.lengthComputable) progress.value = (100 * ev.loaded) / ev.total; });
    xhr.addEventListener("load", () => {
      let payload = {};
      try { payload = JSON.parse(xhr.responseText); } catch (err) { payload = {}; }
      if (xhr.status === 202) {
        progress.value = 100;
        status.textContent = `Uploaded ${payload.version.model}: ${payload.version.status}.`;
        window.location.assign(`/console/adapters/${encodeURIComponent(payload.adapter)}`);
      } else {
        const message = (payload.error && payload.error.message) || (payload.detail && JSON.stringify(payload.detail)) || xhr.statusText;
        status.textContent = `Upload refused (${xhr.status}): ${message}`;
        status.classList.add("error");
      }
    });
    xhr.addEventListener("error", () => { status.textContent = "Upload failed: the connection was lost."; });
    status.classList.remove("error");
    status.textContent = "Uploading…";
    xhr.send(body);
  });
}

// ---- import (a JSON body to the same endpoint: hf://, https:// or s3:// sources) ------------------------

function setupImport() {
  const form = document.getElementById("import-form");
  if (!form) return;
  const status = document.getElementById("import-status");
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const body = {};
    ["name", "base_model", "visibility", "source"].forEach((k) => { body[k] = form.elements[k].value; });
    if (form.elements.hf_token.value) body.hf_token = form.elements.hf_token.value;
    form.elements.hf_token.value = "";  // sent once, never kept in the page
    status.classList.remove("error");
    status.textContent = "Importing…";
    let response;
    try {
      response = await fetch(form.action, {
        method: "POST",
        headers: { "Content-Type": "application/json", "X-CSRF-Token": csrfToken() },
        body: JSON.stringify(body),
      });
    } catch (err) {
      status.textContent = "Import failed: the connection was lost."; return;
    }
    let payload = {};
    try { payload = await response.json(); } catch (err) { payload = {}; }
    if (response.status === 202) {
      status.textContent = `Imported ${payload.version.model}: ${payload.version.status}.`;
      window.location.assign(`/console/adapters/${encodeURIComponent(payload.adapter)}`);
      return;
    }
    const message = (payload.error && payload.error.message) || (payload.detail && JSON.stringify(payload.detail)) || response.statusText;
    status.textContent = `Import refused (${response.status}): ${message}`;
    status.classList.add("error");
  });
}

// ---- playground --------------------------------------------------------------------------------------

async function streamChat(model, prompt, maxTokens, output, stats) {
  output.textContent = ""; stats.textContent = "waiting for a worker…";
  const started = performance.now();
  let firstAt = null;
  const response = await fetch("/console/playground/chat", {
    method: "POST",
    headers: { "Content-Type": "application/json", "X-CSRF-Token": csrfToken() },
    body: JSON.stringify({ model, messages: [{ role: "user", content: prompt }], max_tokens: maxTokens,
      temperature: 0, stream: true, stream_options: { include_usage: true } }),
  });
  if (!response.ok) {
    let message = response.statusText;
    try { const body = await response.json(); message = (body.error && body.error.message) || message; } catch (err) { /* not JSON */ }
    stats.textContent = `refused (${response.status}): ${message}`;
    return;
  }
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  let usage = null;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, cut); buffer = buffer.slice(cut + 2);
      const data = event.split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6)).join("");
      if (!data || data === "[DONE]") continue;
      const chunk = JSON.parse(data);
      if (chunk.error) { stats.textContent = `error: ${chunk.error.message}`; return; }
      if (chunk.usage) usage = chunk.usage;
      const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
      if (delta && delta.content) {
        if (firstAt === null) firstAt = performance.now();
        output.textContent += delta.content;
      }
    }
  }
  const total = performance.now() - started;
  const ttft = firstAt === null ? "–" : `${(firstAt - started).toFixed(0)} ms`;
  stats.textContent = `first token ${ttft}, total ${total.toFixed(0)} ms` + (usage ? `, ${usage.completion_tokens} tokens` : "");
  output.dataset.done = "1";
}

function setupPlayground() {
  const form = document.getElementById("playground-form");
  if (!form) return;
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const select = form.elements.adapter;
    const adapter = select.value;
    const base = select.options[select.selectedIndex].dataset.base;
    const prompt = form.elements.prompt.value;
    const maxTokens = parseInt(form.elements.max_tokens.value, 10);
    document.getElementById("adapter-label").textContent = adapter;
    document.getElementById("base-label").textContent = base;
    ["adapter-output", "base-output"].forEach((id) => { delete document.getElementById(id).dataset.done; });
    streamChat(adapter, prompt, maxTokens, document.getElementById("adapter-output"), document.getElementById("adapter-stats"));
    streamChat(base, prompt, maxTokens, document.getElementById("base-output"), document.getElementById("base-stats"));
  });
}

document.addEventListener("DOMContentLoaded", () => {
  drawCharts(document);
  setupUpload();
  setupImport();
  setupPlayground();
  document.body.addEventListener("htmx:afterSwap", (e) => drawCharts(e.target));
  document.body.addEventListener("htmx:beforeSwap", (e) => {
    // a request of an ended session: go to the sign-in form
    if (e.detail.xhr.status === 401) { window.location.assign("/console/login"); }
  });
});
