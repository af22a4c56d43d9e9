// Cuts a phaserunner chat stream after each of its chunks and resumes it, with the `ai` package itself;
// prints what the package assembled at every cut (as JSON) for tests/integration/test_ai_sdk_resume.py
// to compare with the transcript.
//
//   node chat_cuts.mjs reader <api, e.g. http://127.0.0.1:PORT/chat> <chat id>
//     The run's stream is read whole, then for each cut k: its first k events, then what
//     GET <api>/<id>/stream answers to `Last-Event-ID: <id of event k>`, assembled by
//     readUIMessageStream (chunks parsed and validated by DefaultChatTransport's own parser).
//   node chat_cuts.mjs reader-held <api> <chat id> <file>
//     As `reader`, with the run's stream as read earlier (saved in <file>): a client that read it then
//     resumes now, after what the server holds changed (its live parts gone after live_ttl, say).
//   node chat_cuts.mjs chat <api> <chat id prefix> <text>
//     For each cut k = 1, 2, ... until a response ends before its k-th event: a fresh AbstractChat sends <text> (POST <api>, a new run); the connection drops
//     after the k-th event (a network TypeError, which AbstractChat keeps resumable); resumeStream()
//     reconnects with the last event id it saw. Prints the chat's messages once the resume ended.
//   node chat_cuts.mjs replay <api> <chat id prefix> <text> <wait ms>
//     As `chat`, with DefaultChatTransport as useChat makes it (its resume sends no cursor and takes the
//     answer as a replay of the whole message); resumeStream() runs <wait ms> after the drop.
//   node chat_cuts.mjs send <api> <chat id> <text>
//     AbstractChat sends <text> (useChat's send path); prints the chat's messages once the answer ended.
//   node chat_cuts.mjs approve <api> <chat id> <text> <approve|deny> <reason>
//     AbstractChat sends <text>; the answer ends waiting for approval; addToolApprovalResponse and a
//     sendMessage() send the response (as useChat does with sendAutomaticallyWhen); prints the
//     chat's messages after each answer.
//   node chat_cuts.mjs approve-each <api> <chat id> <text>
//     the same for an answer with several calls waiting, each approved and sent on its own.
//   node chat_cuts.mjs stale-approve <api> <chat id>
//     Two tabs of one chat: tab 1 sends "refund A-1" and holds the call waiting; tab 2 (resumeStream())
//     approves it, the run ends, and it sends "refund A-2" and approves that call too; then tab 1 answers
//     its call. Prints each tab's messages and status.
//   node chat_cuts.mjs regenerate <api> <chat id> <text>...
//     AbstractChat sends each <text>, then regenerate() (the last answer), then regenerate({messageId})
//     of the first answer when there were several; prints the chat's messages after each.
//   node chat_cuts.mjs stop-send <api> <chat id> <text> <stop after ms> <next text>
//     AbstractChat sends <text>, stop()s after <stop after ms> once the server answered (the run goes on), then
//     sends <next text>;
//     prints the chat's messages and status.
//   node chat_cuts.mjs stop-send <api> <chat id> <text> <stop after ms> <next text> regenerate
//     The same, then regenerate() (the last answer); prints the chat as it was before that too ("sent").
//   node chat_cuts.mjs edits <api> <chat id> <scenario>
//     AbstractChat edits messages (sendMessage({text, messageId})), some POSTs failing as a dropped network
//     does (never reaching the server); prints the chat's texts, status and errors after each step. Scenarios:
//     edit-then-retry (edit "hello" to "goodbye", then regenerate()), edit-then-send (then a new message),
//     failed-then-edit (a message lost, then edited and sent), failed-then-resend (a first message lost, then
//     sendMessage() sends what the chat holds).
//   node chat_cuts.mjs resume-new <api> <chat id>
//     useChat's resume (resumeStream()) of a chat that has no run yet.
import { readFileSync } from "node:fs";
import { AbstractChat, DefaultChatTransport, readUIMessageStream } from "ai";

const [mode, api, ...rest] = process.argv.slice(2);

// The assembled parts, keeping only what the transcript can say.
function parts(message) {
  return message.parts.map((p) => {
    if (p.type === "step-start") return { type: p.type };
    if (p.type === "text") return { type: p.type, text: p.text, state: p.state };
    if (p.type.startsWith("tool-")) {
      const out = { type: p.type, toolCallId: p.toolCallId, state: p.state, input: p.input };
      if (p.output !== undefined) out.output = p.output;
      if (p.approval !== undefined) out.approval = p.approval;
      return out;
    }
    return p;
  });
}

function summary(messages) {
  return messages.map((m) => ({ role: m.role, parts: parts(m) }));
}

// SSE events of a body: [{ id, raw }] (raw: the event's text with its blank line).
function events(text) {
  return text.split("\n\n").filter((e) => e.trim() && !e.startsWith(":")).map((raw) => {
    const id = raw.split("\n").find((l) => l.startsWith("id: "));
    return { id: id ? id.slice(4) : null, raw: raw + "\n\n" };
  });
}

function bytes(text) {
  return new ReadableStream({
    start(controller) {
      controller.enqueue(new TextEncoder().encode(text));
      controller.close();
    },
  });
}

async function assemble(text) {
  const stream = new DefaultChatTransport({ api }).processResponseStream(bytes(text));
  let last;
  const errors = [];
  try {
    for await (const message of readUIMessageStream({ stream, onError: (e) => errors.push(String(e)) })) {
      last = message;
    }
  } catch (e) {
    errors.push(String(e));
  }
  return { parts: last ? parts(last) : null, errors };
}

async function reader(chatId, held = null) {
  const url = `${api}/${encodeURIComponent(chatId)}/stream`;
  const read = held ?? await (await fetch(url)).text();
  const whole = events(read).filter((e) => !e.raw.startsWith("data: [DONE]"));
  const cuts = [];
  for (let k = 1; k <= whole.length; k++) {
    // As EventSource does: the last id received, whichever event carried it.
    const after = whole.slice(0, k).reverse().find((e) => e.id !== null)?.id;
    const response = await fetch(url, { headers: after ? { "Last-Event-ID": after } : {} });
    const resumed = await response.text();
    const text = whole.slice(0, k).map((e) => e.raw).join("") + resumed;
    cuts.push({ cut: k, after, status: response.status, ...(await assemble(text)) });
  }
  return { events: whole.length, cuts };
}

class Chat extends AbstractChat {
  constructor(options) {
    const state = {
      status: "ready",
      error: undefined,
      messages: [],
      pushMessage(m) { this.messages = [...this.messages, m]; },
      popMessage() { this.messages = this.messages.slice(0, -1); },
      replaceMessage(i, m) { this.messages = this.messages.map((x, j) => (j === i ? m : x)); },
      snapshot: (thing) => structuredClone(thing),
    };
    super({ ...options, state });
  }
}

// A fetch whose POST responses drop after `cut` SSE events, as a lost connection does.
function droppingFetch(cut, seen) {
  return async (url, init) => {
    const response = await fetch(url, init);
    if (init?.method !== "POST" || cut == null || !response.body) {
      return response;
    }
    const upstream = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    let passed = 0;
    let cutNow = false;
    const body = new ReadableStream({
      async pull(controller) {
        if (cutNow) {
          // A dropped connection is noticed well after its last bytes arrived: by then the chat has
          // processed them (an error right away would discard what the parsing pipes still hold).
          await new Promise((resolve) => setTimeout(resolve, 200));
          controller.error(new TypeError("network error: connection lost"));
          return;
        }
        const { done, value } = await upstream.read();
        if (done) {
          controller.close();
          return;
        }
        buffer += decoder.decode(value, { stream: true });
        let end;
        while ((end = buffer.indexOf("\n\n")) !== -1) {
          const raw = buffer.slice(0, end + 2);
          buffer = buffer.slice(end + 2);
          controller.enqueue(new TextEncoder().encode(raw));
          const [event] = events(raw);
          if (event != null && !event.raw.startsWith("data: [DONE]")) {
            if (event.id != null) seen.last = event.id;
            if (++passed >= cut) {
              await upstream.cancel();
              cutNow = true;
              return;
            }
          }
        }
      },
    });
    return new Response(body, { status: response.status, headers: response.headers });
  };
}

async function chat(prefix, text, replay = false, wait = 0) {
  const results = [];
  for (let k = 1; k <= 500; k++) {
    const seen = { last: null };
    const errors = [];
    const transport = new DefaultChatTransport(replay ? { api, fetch: droppingFetch(k, seen) } : {
      api,
      fetch: droppingFetch(k, seen),
      // Resume where the drop left it: the chunks after the last one received, on top of what the chat holds.
      resumeStreamIsReplay: false,
      prepareReconnectToStreamRequest: ({ headers }) => ({ headers: { ...headers, "Last-Event-ID": seen.last } }),
    });
    const c = new Chat({ id: `${prefix}-${k}`, transport, onError: (e) => errors.push(String(e)) });
    await c.sendMessage({ text });
    const dropped = c.status === "error";
    if (dropped && wait) await new Promise((resolve) => setTimeout(resolve, wait));
    if (dropped) await c.resumeStream();
    results.push({ cut: k, dropped, after: seen.last, status: c.status, errors, messages: summary(c.messages) });
    if (!dropped) break;
  }
  return results;
}

async function approve(chatId, text, verdict, reason) {
  const errors = [];
  const c = new Chat({ id: chatId, transport: new DefaultChatTransport({ api }), onError: (e) => errors.push(String(e)) });
  await c.sendMessage({ text });
  const asked = summary(c.messages);
  const pending = c.lastMessage.parts.find((p) => p.state === "approval-requested");
  if (!pending) return { asked, errors };
  await c.addToolApprovalResponse({ id: pending.approval.id, approved: verdict === "approve", reason });
  const responded = summary(c.messages);
  await c.sendMessage();
  return { asked, responded, after: summary(c.messages), errors };
}

// Each call waiting for approval answered on its own, with a sendMessage() after each (as useChat's
// sendAutomaticallyWhen does only once all are answered; a client may send sooner): each send must end.
async function approveEach(chatId, text) {
  const errors = [];
  const c = new Chat({ id: chatId, transport: new DefaultChatTransport({ api }), onError: (e) => errors.push(String(e)) });
  await c.sendMessage({ text });
  const steps = [];
  for (;;) {
    const pending = c.lastMessage.parts.find((p) => p.state === "approval-requested");
    if (!pending) break;
    await c.addToolApprovalResponse({ id: pending.approval.id, approved: true });
    await c.sendMessage();
    steps.push({ status: c.status, parts: parts(c.lastMessage) });
  }
  return { steps, after: summary(c.messages), errors };
}

async function staleApprove(chatId) {
  const errors = [];
  const tab = (name) => new Chat({ id: chatId, transport: new DefaultChatTransport({ api }),
    onError: (e) => errors.push(`${name}: ${e}`) });
  const answer = async (c) => {
    const pending = c.lastMessage.parts.find((p) => p.state === "approval-requested");
    await c.addToolApprovalResponse({ id: pending.approval.id, approved: true });
    await c.sendMessage();
  };
  const one = tab("tab 1");
  await one.sendMessage({ text: "refund A-1" });
  const two = tab("tab 2");
  await two.resumeStream();
  await answer(two);
  await two.sendMessage({ text: "refund A-2" });
  await answer(two);
  await answer(one);
  return { one: summary(one.messages), oneStatus: one.status, two: summary(two.messages), twoStatus: two.status,
    errors };
}

async function regenerate(chatId, texts) {
  const errors = [];
  const c = new Chat({ id: chatId, transport: new DefaultChatTransport({ api }), onError: (e) => errors.push(String(e)) });
  for (const text of texts) await c.sendMessage({ text });
  const sent = summary(c.messages);
  await c.regenerate();
  const latest = { status: c.status, messages: summary(c.messages), errors: [...errors] };
  if (texts.length < 2) return { sent, latest };
  await c.regenerate({ messageId: c.messages[1].id });
  return { sent, latest, earlier: { status: c.status, messages: summary(c.messages), errors } };
}

async function stopSend(chatId, text, ms, next, then) {
  const errors = [];
  let answered = false;  // the server answered the first POST: its run started
  const fetchy = async (url, init) => { const r = await fetch(url, init); answered = true; return r; };
  const c = new Chat({ id: chatId, transport: new DefaultChatTransport({ api, fetch: fetchy }),
    onError: (e) => errors.push(String(e)) });
  const first = c.sendMessage({ text });
  await new Promise((resolve) => setTimeout(resolve, ms));
  // Stopped once the server answered the POST (its run started): on a loaded machine <stop after ms> alone
  // could stop the POST before it was sent.
  const deadline = Date.now() + 30000;
  while (!answered && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 10));
  await c.stop();
  await first;
  const stopped = c.status;
  await c.sendMessage({ text: next });
  if (then !== "regenerate") return { stopped, status: c.status, messages: summary(c.messages), errors };
  const sent = { status: c.status, messages: summary(c.messages), errors: [...errors] };
  await c.regenerate();
  return { stopped, sent, status: c.status, messages: summary(c.messages), errors };
}

// useChat({ resume: true }) on a chat that has no run yet: nothing to resume, no error.
async function resumeNew(chatId) {
  const errors = [];
  const c = new Chat({ id: chatId, transport: new DefaultChatTransport({ api }), onError: (e) => errors.push(String(e)) });
  await c.resumeStream();
  return { status: c.status, messages: c.messages.length, errors };
}

async function edits(chatId, scenario) {
  const errors = [];
  let failNext = 0;  // POSTs that fail as a dropped network does (they never reach the server)
  const fetchy = async (url, init) => {
    if (init?.method === "POST" && failNext > 0) { failNext--; throw new TypeError("fetch failed (network down)"); }
    return fetch(url, init);
  };
  const c = new Chat({ id: chatId, transport: new DefaultChatTransport({ api, fetch: fetchy }),
    onError: (e) => errors.push(String(e)) });
  const texts = () => c.messages.map((m) => `${m.role}: ${m.parts.filter((p) => p.type === "text").map((p) => p.text).join("")}`);
  const steps = [];
  const note = () => steps.push({ status: c.status, texts: texts(), errors: errors.splice(0) });
  if (scenario === "failed-then-resend") failNext = 1;
  await c.sendMessage({ text: "hello" }); note();
  if (scenario === "failed-then-resend") {
    await c.sendMessage(); note();
  } else if (scenario === "failed-then-edit") {
    failNext = 1;
    await c.sendMessage({ text: "refund A-1" }); note();
    await c.sendMessage({ text: "refund A-2", messageId: c.messages[2].id }); note();
  } else {
    await c.sendMessage({ text: "goodbye", messageId: c.messages[0].id }); note();
    if (scenario === "edit-then-retry") await c.regenerate();
    else await c.sendMessage({ text: "more" });
    note();
  }
  return steps;
}

async function send(chatId, text) {
  const errors = [];
  const c = new Chat({ id: chatId, transport: new DefaultChatTransport({ api }), onError: (e) => errors.push(String(e)) });
  await c.sendMessage({ text });
  return { messages: summary(c.messages), status: c.status, errors };
}

let result;
if (mode === "send") result = await send(rest[0], rest[1]);
else if (mode === "reader") result = await reader(rest[0]);
else if (mode === "reader-held") result = await reader(rest[0], readFileSync(rest[1], "utf8"));
else if (mode === "chat") result = await chat(rest[0], rest[1]);
else if (mode === "replay") result = await chat(rest[0], rest[1], true, Number(rest[2]));
else if (mode === "approve") result = await approve(rest[0], rest[1], rest[2], rest[3]);
else if (mode === "approve-each") result = await approveEach(rest[0], rest[1]);
else if (mode === "stale-approve") result = await staleApprove(rest[0]);
else if (mode === "regenerate") result = await regenerate(rest[0], rest.slice(1));
else if (mode === "stop-send") result = await stopSend(rest[0], rest[1], Number(rest[2]), rest[3], rest[4]);
else if (mode === "resume-new") result = await resumeNew(rest[0]);
else if (mode === "edits") result = await edits(rest[0], rest[1]);
else throw new Error(`unknown mode ${mode}`);
console.log(JSON.stringify(result));
