// The playground: chats with the free tier through the public /v1 API and streams the
// answer as it arrives (fetch + ReadableStream, server-sent events parsed by hand).
// Each turn sends the whole conversation, like any client; the usage chunk at the end
// says how many prompt tokens came from the KV cache and from which tier. Each turn's row
// shows its time to first token (measured here, from sending to the first token) and what
// recomputing its cached tokens would have cost at the worker's measured prefill rate
// (GET /playground/prefill). "Send to cold storage" posts to /playground/cold-storage,
// which moves this visitor's own pages to the NAS or the object store.
"use strict";

(function () {
  const form = document.getElementById("chat");
  const input = document.getElementById("prompt");
  const send = document.getElementById("send");
  const modelSelect = document.getElementById("model");
  const transcript = document.getElementById("transcript");
  const stats = document.getElementById("stats");
  const errorBox = document.getElementById("error");
  const turns = document.getElementById("turns");
  const coldForm = document.getElementById("cold");
  const coldTier = document.getElementById("cold-tier");
  const coldSend = document.getElementById("cold-send");
  const coldStatus = document.getElementById("cold-status");
  const TIERS = { device: "GPU", host: "host RAM", nas: "NAS", object: "object store" };
  const messages = [];
  // One id per page: the gateway keeps the conversation on one worker.
  const session = "pg-" + Math.random().toString(36).slice(2) + Date.now().toString(36);

  function bubble(role, text) {
    const div = document.createElement("div");
    div.className = "turn " + role;
    div.textContent = text;
    transcript.appendChild(div);
    return div;
  }

  async function loadModels() {
    const reply = await fetch("/v1/models");
    const body = await reply.json();
    modelSelect.replaceChildren();
    for (const m of body.data || []) {
      const option = document.createElement("option");
      option.value = option.textContent = m.id;
      modelSelect.appendChild(option);
    }
    if (!modelSelect.options.length) {
      errorBox.textContent = "No model is being served right now; try again in a minute.";
    }
  }

  function showUsage(usage) {
    const details = usage.prompt_tokens_details || {};
    const cached = details.cached_tokens || 0;
    const byTier = Object.entries(details.cached_tokens_by_tier || {})
      .filter(function (entry) { return entry[1] > 0; })
      .map(function (entry) { return (TIERS[entry[0]] || entry[0]) + " " + entry[1]; });
    stats.replaceChildren(
      "Prompt tokens: ",
      strong(usage.prompt_tokens, "prompt-tokens"),
      " · from cache: ",
      strong(cached, "cached-tokens"),
      byTier.length ? " (" + byTier.join(", ") + ")" : "",
      " · completion tokens: ",
      strong(usage.completion_tokens, "completion-tokens"),
    );
  }

  // One row per turn: its first token, its cached tokens by tier (each tier's count in a
  // cell of its own, data-tier naming it), and the recompute estimate once the rate is in.
  function addTurnRow(ttft, usage) {
    const details = usage.prompt_tokens_details || {};
    const cached = details.cached_tokens || 0;
    const byTier = details.cached_tokens_by_tier || {};
    const row = document.createElement("tr");
    const tiers = document.createElement("td");
    tiers.className = "tiers";
    const parts = Object.keys(TIERS).filter(function (t) { return (byTier[t] || 0) > 0; });
    if (!parts.length) tiers.textContent = "none (" + usage.prompt_tokens + " computed)";
    parts.forEach(function (tier, i) {
      const span = document.createElement("span");
      span.dataset.tier = tier;
      span.textContent = TIERS[tier] + " " + byTier[tier];
      if (i) tiers.append(", ");
      tiers.append(span);
    });
    const recompute = cell("…");
    recompute.className = "recompute";
    row.append(cell(String(turns.tBodies[0].rows.length + 1)), cell(seconds(ttft)), tiers, recompute);
    turns.tBodies[0].appendChild(row);
    turns.hidden = false;
    fillRecompute(recompute, cached);
  }

  async function fillRecompute(target, cached) {
    if (!cached) {
      target.textContent = "nothing cached";
      return;
    }
    try {
      const reply = await fetch("/playground/prefill?model=" + encodeURIComponent(modelSelect.value));
      const rate = reply.ok ? (await reply.json()).prefill_tokens_per_s : null;
      target.textContent = rate
        ? "~" + seconds(cached / rate) + " for " + cached + " tokens at " + Math.round(rate) + " tokens/s"
        : "no prefill rate measured yet";
    } catch (_) {
      target.textContent = "prefill rate unavailable";
    }
  }

  function cell(text) {
    const td = document.createElement("td");
    td.textContent = text;
    return td;
  }

  function seconds(s) {
    return s < 1 ? Math.round(s * 1000) + " ms" : s.toFixed(2) + " s";
  }

  function strong(value, id) {
    const el = document.createElement("strong");
    el.id = id;
    el.textContent = String(value);
    return el;
  }

  async function errorText(reply) {
    try {
      const body = await reply.json();
      return (body.error && body.error.message) || reply.statusText;
    } catch (_) {
      return reply.statusText;
    }
  }

  async function turn(text) {
    messages.push({ role: "user", content: text });
    bubble("user", text);
    const out = bubble("assistant", "");
    const started = performance.now();
    let ttft = null;
    let usage = null;
    const reply = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: { "content-type": "application/json", "x-session-id": session },
      body: JSON.stringify({
        model: modelSelect.value,
        messages: messages,
        max_tokens: 64,
        stream: true,
        stream_options: { include_usage: true },
      }),
    });
    if (!reply.ok) {
      messages.pop();
      out.remove();
      throw new Error(await errorText(reply));
    }
    const reader = reply.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    let answer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data: ")) continue;
          const data = line.slice(6);
          if (data === "[DONE]") continue;
          const chunk = JSON.parse(data);
          if (chunk.error) throw new Error(chunk.error.message || "the stream failed");
          for (const choice of chunk.choices || []) {
            const piece = (choice.delta && choice.delta.content) || "";
            if (piece && ttft === null) ttft = (performance.now() - started) / 1000;
            answer += piece;
            out.textContent = answer;
          }
          if (chunk.usage) {
            usage = chunk.usage;
            showUsage(usage);
          }
        }
      }
    }
    messages.push({ role: "assistant", content: answer });
    if (usage) addTurnRow(ttft === null ? (performance.now() - started) / 1000 : ttft, usage);
    out.dataset.done = "1";
  }

  async function sendToColdStorage(tier) {
    const reply = await fetch("/playground/cold-storage", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ tier: tier }),
    });
    if (!reply.ok) throw new Error(await errorText(reply));
    const moved = await reply.json();
    const name = TIERS[moved.tier] || moved.tier;
    coldStatus.dataset.tier = moved.tier;
    coldStatus.textContent = moved.pages
      ? "Moved " + moved.pages + " pages to the " + name + " (" + moved.device_pages +
        " off the GPU, " + moved.host_pages + " out of host RAM). The next turn comes back from there."
      : "Nothing of this conversation was cached; nothing moved.";
  }

  form.addEventListener("submit", async function (event) {
    event.preventDefault();
    const text = input.value.trim();
    if (!text) return;
    input.value = "";
    errorBox.textContent = "";
    send.disabled = true;
    try {
      await turn(text);
    } catch (err) {
      errorBox.textContent = String(err.message || err);
    } finally {
      send.disabled = false;
      input.focus();
    }
  });

  coldForm.addEventListener("submit", async function (event) {
    event.preventDefault();
    errorBox.textContent = "";
    coldStatus.textContent = "Moving…";
    delete coldStatus.dataset.tier;
    coldSend.disabled = true;
    try {
      await sendToColdStorage(coldTier.value);
    } catch (err) {
      coldStatus.textContent = "";
      errorBox.textContent = String(err.message || err);
    } finally {
      coldSend.disabled = false;
    }
  });

  loadModels().catch(function (err) {
    errorBox.textContent = "Could not list models: " + err;
  });
})();
