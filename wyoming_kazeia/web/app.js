// Kazeia TTS's page: speak with a voice as the audio streams (Web Audio), and manage your own
// voices. Every URL is relative, so the page works behind Home Assistant's ingress prefix.
"use strict";

const $ = (id) => document.getElementById(id);
const page = {
  key: localStorage.getItem("kazeia-api-key") || "",
  ctx: null, // the AudioContext, made on the first click (browsers want a gesture)
  meter: null, // every played sample passes through it
  sources: [],
  speaking: null, // the AbortController of the request being played
  recorder: null,
  recorded: null, // a Blob (WAV) recorded on this page
  info: null,
  libraryShown: "", // the library as the table shows it
};
// What the page played, for whoever checks it (the tests): samples heard and their peak.
window.kazeia = { heard: { samples: 0, peak: 0 }, firstAudioMs: null };

async function api(path, options = {}) {
  const headers = Object.assign({}, options.headers || {});
  if (page.key) headers.Authorization = "Bearer " + page.key;
  const response = await fetch(path, Object.assign({}, options, { headers }));
  if (!response.ok) {
    if (response.status === 401) $("key-section").hidden = false;
    let message = `${response.status} ${response.statusText}`;
    try {
      const body = await response.json();
      if (body.error && body.error.message) message = body.error.message;
    } catch (e) { /* not JSON: the status says it */ }
    throw new Error(message);
  }
  return response;
}

function say(id, text, error = false) {
  $(id).textContent = text;
  $(id).classList.toggle("error", error);
}

// -- playing -------------------------------------------------------------------------------

function audioContext() {
  if (!page.ctx) {
    page.ctx = new AudioContext();
    page.meter = page.ctx.createScriptProcessor(2048, 1, 1);
    page.meter.onaudioprocess = (event) => {
      const input = event.inputBuffer.getChannelData(0);
      const output = event.outputBuffer.getChannelData(0);
      let peak = 0;
      for (let i = 0; i < input.length; i++) {
        output[i] = input[i];
        peak = Math.max(peak, Math.abs(input[i]));
      }
      if (peak > 0) {
        window.kazeia.heard.samples += input.length;
        window.kazeia.heard.peak = Math.max(window.kazeia.heard.peak, peak);
      }
    };
    page.meter.connect(page.ctx.destination);
  }
  return page.ctx;
}

function stopPlaying() {
  if (page.speaking) page.speaking.abort(); // the server cancels the synthesis
  page.speaking = null;
  for (const source of page.sources) {
    try { source.stop(); } catch (e) { /* never started */ }
  }
  page.sources = [];
  $("stop").disabled = true;
}

async function speak(voice) {
  const ctx = audioContext();
  await ctx.resume();
  stopPlaying();
  const controller = new AbortController();
  page.speaking = controller;
  $("stop").disabled = false;
  const started = performance.now();
  say("speak-status", "Synthesizing…");
  const request = { model: "kazeia", input: $("text").value, voice, response_format: "pcm" };
  const style = $("instructions").value.trim();
  if (style && !$("instructions-row").hidden) request.instructions = style;
  try {
    const response = await api("v1/audio/speech", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(request),
      signal: controller.signal,
    });
    const rate = Number(response.headers.get("X-Sample-Rate")) || 24000;
    const reader = response.body.getReader();
    let next = 0, carry = null, first = null, samples = 0;
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      let bytes = value;
      if (carry) { // a sample split between two reads
        bytes = new Uint8Array(carry.length + value.length);
        bytes.set(carry);
        bytes.set(value, carry.length);
        carry = null;
      }
      const whole = bytes.length - (bytes.length % 2);
      if (whole < bytes.length) carry = bytes.slice(whole);
      if (!whole) continue;
      const view = new DataView(bytes.buffer, bytes.byteOffset, whole);
      const buffer = ctx.createBuffer(1, whole / 2, rate);
      const data = buffer.getChannelData(0);
      for (let i = 0; i < data.length; i++) data[i] = view.getInt16(2 * i, true) / 32768;
      const source = ctx.createBufferSource();
      source.buffer = buffer;
      source.connect(page.meter);
      next = Math.max(next, ctx.currentTime + 0.05);
      source.start(next);
      next += buffer.duration;
      page.sources.push(source);
      source.onended = () => { // the last one played: nothing left to stop
        page.sources = page.sources.filter((s) => s !== source);
        if (!page.sources.length && !page.speaking) $("stop").disabled = true;
      };
      samples += data.length;
      if (first === null) {
        first = performance.now() - started;
        window.kazeia.firstAudioMs = first;
        say("speak-status", `First audio after ${Math.round(first)} ms…`);
      }
    }
    const total = (performance.now() - started) / 1000;
    say("speak-status", `First audio after ${Math.round(first || 0)} ms; ` +
      `${(samples / rate).toFixed(1)} s of audio, synthesized in ${total.toFixed(1)} s.`);
  } catch (err) {
    if (err.name !== "AbortError") say("speak-status", err.message, true);
  } finally {
    if (page.speaking === controller) page.speaking = null;
    if (!page.sources.length) $("stop").disabled = true;
    loadInfo().catch(() => {}); // the served count and the last first-audio time
  }
}

// -- what the server has -------------------------------------------------------------------

async function loadVoices() {
  const { voices, default: fallback } = await (await api("v1/audio/voices")).json();
  const select = $("voice");
  const chosen = select.value;
  select.replaceChildren(...voices.map((v) => new Option(`${v.name}: ${v.description}`, v.id)));
  select.value = voices.some((v) => v.id === chosen) ? chosen : fallback;
}

async function loadInfo() {
  const info = await (await api("api/info")).json();
  page.info = info;
  $("model").textContent = info.model;
  const badge = $("state");
  badge.textContent = info.ready ? info.status.state : `loading: ${info.loading}`;
  badge.className = "badge " + (info.ready ? "ready" : "loading");
  $("instructions-row").hidden = !info.follows_instructions;

  const languages = $("new-language");
  if (!languages.options.length) {
    languages.replaceChildren(...info.languages.map((code) => new Option(code, code)));
  }
  const note = $("clone-note");
  note.hidden = info.can_clone;
  // Without a Base model the form can only fail: it waits, greyed, for one.
  for (const control of $("add-voice").elements) control.disabled = !info.can_clone;
  note.textContent = "Cloning needs a Base model: start the server with " +
    "--voice-model Qwen/Qwen3-TTS-12Hz-0.6B-Base (the add-on's \"Model of your own voices\").";

  // Rows are made again only when the library changed: a click on one is never lost.
  const shown = JSON.stringify([info.library, info.default_voice]);
  if (shown !== page.libraryShown) {
    page.libraryShown = shown;
    showLibrary(info);
  }

  const settings = Object.assign(
    { model: info.model, default_voice: info.default_voice, served: info.status.served,
      last_first_audio_s: info.status.last_first_audio_s, last_rtf: info.status.last_rtf },
    info.settings);
  $("settings").tBodies[0].replaceChildren(...Object.entries(settings).map(([key, value]) => {
    const row = document.createElement("tr");
    const k = document.createElement("th");
    k.textContent = key.replaceAll("_", " ");
    const v = document.createElement("td");
    v.textContent = value === null ? "model's / unset" : String(value);
    row.append(k, v);
    return row;
  }));
  if (!info.ready) setTimeout(refresh, 3000);
}

function showLibrary(info) {
  const rows = info.library.map((voice) => {
    const row = document.createElement("tr");
    row.dataset.voice = voice.name;
    const name = document.createElement("td");
    name.textContent = voice.name;
    if (voice.name === info.default_voice) {
      const mark = document.createElement("span");
      mark.className = "default";
      mark.textContent = " (default)";
      name.append(mark);
    }
    const language = document.createElement("td");
    language.textContent = voice.language;
    const what = document.createElement("td");
    what.textContent = voice.summary + (voice.spoken ? "" : " (not spoken by this server's models)");
    const actions = document.createElement("td");
    const button = (label, action, enabled = true) => {
      const b = document.createElement("button");
      b.type = "button";
      b.className = "plain";
      b.textContent = label;
      b.dataset.action = label.toLowerCase();
      b.disabled = !enabled;
      b.addEventListener("click", () => action(voice.name));
      actions.append(b);
    };
    button("Preview", (v) => speak(v), voice.spoken);
    button("Default", makeDefault, voice.spoken && voice.name !== info.default_voice);
    button("Rename", rename);
    button("Delete", remove);
    row.append(name, language, what, actions);
    return row;
  });
  $("library").tBodies[0].replaceChildren(...rows);
  $("library-empty").hidden = rows.length > 0;
}

async function refresh() {
  try {
    await loadInfo();
    await loadVoices();
  } catch (err) {
    $("state").textContent = err.message;
    $("state").className = "badge";
  }
}

// -- your voices ---------------------------------------------------------------------------

async function makeDefault(name) {
  await act(() => api("api/default-voice", {
    method: "PUT", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ voice: name }),
  }), `${name} is the default voice`);
}

async function rename(name) {
  const to = prompt(`New name for ${name}`, name);
  if (!to || to === name) return;
  await act(() => api(`api/voices/${encodeURIComponent(name)}`, {
    method: "PATCH", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ name: to }),
  }), `${name} is now ${to}`);
}

async function remove(name) {
  if (!confirm(`Delete the voice ${name}?`)) return;
  await act(() => api(`api/voices/${encodeURIComponent(name)}`, { method: "DELETE" }),
    `${name} deleted`);
}

async function act(request, done) {
  try {
    await request();
    say("add-status", done);
  } catch (err) {
    say("add-status", err.message, true);
  }
  await refresh();
}

async function addVoice(event) {
  event.preventDefault();
  const form = new FormData($("add-voice"));
  const file = $("new-audio").files[0];
  form.delete("audio");
  if (file) form.append("audio", file, file.name);
  else if (page.recorded) form.append("audio", page.recorded, "recording.wav");
  else return say("add-status", "Choose a recording, or record one.", true);
  if (form.get("language") === "auto") form.delete("language");
  $("add").disabled = true;
  say("add-status", "Adding…");
  try {
    const added = await (await api("api/voices", { method: "POST", body: form })).json();
    say("add-status", `Added ${added.name}: ${added.summary}`);
    $("add-voice").reset();
    page.recorded = null;
    $("preview").hidden = true;
    $("record-time").textContent = "";
    await refresh();
    $("voice").value = added.name;
  } catch (err) {
    say("add-status", err.message, true);
  } finally {
    $("add").disabled = false;
  }
}

function showPreview(blob) {
  const preview = $("preview");
  if (preview.src) URL.revokeObjectURL(preview.src);
  preview.src = URL.createObjectURL(blob);
  preview.hidden = false;
}

// Records from the microphone into a 16-bit WAV (the server reads WAV, FLAC and OGG; a
// browser's own recorder writes WebM), at most 10 s.
async function toggleRecording() {
  if (page.recorder) return page.recorder.stop();
  let stream;
  try {
    stream = await navigator.mediaDevices.getUserMedia({ audio: true });
  } catch (err) {
    return say("add-status", `No microphone: ${err.message}`, true);
  }
  const ctx = new AudioContext();
  const input = ctx.createMediaStreamSource(stream);
  const tap = ctx.createScriptProcessor(4096, 1, 1);
  const chunks = [];
  const started = performance.now();
  tap.onaudioprocess = (event) => {
    chunks.push(new Float32Array(event.inputBuffer.getChannelData(0)));
    const seconds = (performance.now() - started) / 1000;
    $("record-time").textContent = `${seconds.toFixed(1)} s`;
    if (seconds >= 10) page.recorder.stop();
  };
  input.connect(tap);
  tap.connect(ctx.destination);
  $("record").textContent = "Stop";
  page.recorder = {
    stop() {
      page.recorder = null;
      tap.disconnect();
      input.disconnect();
      stream.getTracks().forEach((track) => track.stop());
      ctx.close();
      $("record").textContent = "Record";
      page.recorded = wav(chunks, ctx.sampleRate);
      $("new-audio").value = "";
      showPreview(page.recorded);
    },
  };
}

function wav(chunks, rate) {
  const length = chunks.reduce((n, c) => n + c.length, 0);
  const view = new DataView(new ArrayBuffer(44 + 2 * length));
  const text = (at, s) => [...s].forEach((ch, i) => view.setUint8(at + i, ch.charCodeAt(0)));
  text(0, "RIFF"); view.setUint32(4, 36 + 2 * length, true); text(8, "WAVEfmt ");
  view.setUint32(16, 16, true); view.setUint16(20, 1, true); view.setUint16(22, 1, true);
  view.setUint32(24, rate, true); view.setUint32(28, 2 * rate, true);
  view.setUint16(32, 2, true); view.setUint16(34, 16, true);
  text(36, "data"); view.setUint32(40, 2 * length, true);
  let at = 44;
  for (const chunk of chunks) {
    for (const x of chunk) {
      view.setInt16(at, Math.max(-1, Math.min(1, x)) * 32767, true);
      at += 2;
    }
  }
  return new Blob([view], { type: "audio/wav" });
}

// -- wiring ----------------------------------------------------------------------------------

$("speak").addEventListener("click", () => speak($("voice").value));
$("stop").addEventListener("click", stopPlaying);
$("add-voice").addEventListener("submit", addVoice);
$("record").addEventListener("click", toggleRecording);
$("new-audio").addEventListener("change", () => {
  const file = $("new-audio").files[0];
  if (file) {
    page.recorded = null;
    showPreview(file);
  }
});
$("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  page.key = $("key").value.trim();
  localStorage.setItem("kazeia-api-key", page.key);
  $("key-section").hidden = true;
  refresh();
});
$("api-url").textContent = new URL("v1", document.baseURI).href;
refresh();
