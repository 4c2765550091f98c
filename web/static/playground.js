// The playground: chats with the free tier through the public /v1 API and streams the
// answer as it arrives (fetch + ReadableStream, server-sent events parsed by hand).
// Each turn sends the whole conversation, like any client; the usage chunk at the end
// says how many prompt tokens came from the KV cache.
"use strict";

(function () {
  const form = document.getElementById("chat");
  const input = document.getElementById("prompt");
  const send = document.getElementById("send");
  const modelSelect = document.getElementById("model");
  const transcript = document.getElementById("transcript");
  const stats = document.getElementById("stats");
  const errorBox = document.getElementById("error");
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
      .map(function (entry) { return entry[0] + " " + entry[1]; });
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
            answer += piece;
            out.textContent = answer;
          }
          if (chunk.usage) showUsage(chunk.usage);
        }
      }
    }
    messages.push({ role: "assistant", content: answer });
    out.dataset.done = "1";
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

  loadModels().catch(function (err) {
    errorBox.textContent = "Could not list models: " + err;
  });
})();
