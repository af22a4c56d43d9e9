// Reads a phaserunner chat stream with the `ai` package itself and checks the assembled UI message
// against the stored transcript.
//
//   node read_ui_message.mjs <api url, e.g. http://127.0.0.1:PORT/chat> <chat id> <transcript JSON>
//
// The stream is fetched by the AI SDK's own chat transport (reconnectToStream: GET <api>/<id>/stream,
// every chunk validated against uiMessageChunkSchema) and assembled by readUIMessageStream. The
// transcript is the run's committed messages (OpenAI chat format) after its user message.
import assert from "node:assert/strict";
import { DefaultChatTransport, readUIMessageStream } from "ai";

const [api, chatId, transcriptJson] = process.argv.slice(2);
const transcript = JSON.parse(transcriptJson);

// What the UI message must hold: per assistant message one step, its text, then its tool calls
// with the results the transcript recorded for them.
function expectedParts(messages) {
  const results = new Map(messages.filter((m) => m.role === "tool").map((m) => [m.tool_call_id, m.content]));
  const parts = [];
  for (const m of messages.filter((m) => m.role === "assistant")) {
    parts.push({ type: "step-start" });
    if (m.content) parts.push({ type: "text", text: m.content, state: "done" });
    for (const call of m.tool_calls ?? []) {
      const done = results.has(call.id);
      parts.push({
        type: `tool-${call.function.name}`,
        toolCallId: call.id,
        state: done ? "output-available" : "input-available",
        input: JSON.parse(call.function.arguments),
        output: done ? results.get(call.id) : undefined,
      });
    }
  }
  return parts;
}

// The assembled parts, keeping only what the transcript can say.
function assembledParts(message) {
  return message.parts.map((p) => {
    if (p.type === "step-start") return { type: p.type };
    if (p.type === "text") return { type: p.type, text: p.text, state: p.state };
    if (p.type.startsWith("tool-")) {
      return { type: p.type, toolCallId: p.toolCallId, state: p.state, input: p.input, output: p.output };
    }
    return p;
  });
}

const transport = new DefaultChatTransport({ api });
const stream = await transport.reconnectToStream({ chatId });
assert.ok(stream, "the server answered 204: no stream");
let last;
const errors = [];
for await (const message of readUIMessageStream({ stream, onError: (e) => errors.push(String(e)) })) {
  last = message;
}
assert.ok(last, "the stream assembled no message");
assert.deepEqual(errors, [], "the stream reported errors");
assert.equal(last.role, "assistant");
assert.deepEqual(assembledParts(last), expectedParts(transcript));
console.log(JSON.stringify({ ok: true, id: last.id, parts: last.parts.length }));
