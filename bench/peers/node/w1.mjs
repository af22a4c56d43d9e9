// Workload W1 (bench/w1.py) on @claritylabs/cl-pipelines 0.1.0: runAgent on its in-memory storage and
// scheduler, then scheduler.drain(), with the AI SDK's MockLanguageModelV4 answering from a script.
//
//   node --expose-gc w1.mjs --jobs 200 --turns 10 --runs 1    (run by bench/peers/run.py, which sets BENCH_W1)
//
// Prints one JSON line: {"peer": ..., "turns_per_s": [one per run], ...}. No network: the model is a
// mock, storage and scheduler are in-process maps and arrays.
import { readFileSync } from "node:fs";

import { advancePhase, buildAgentPhase, createMemoryScheduler, createMemoryStorage, runAgent } from "@claritylabs/cl-pipelines";
import { tool } from "ai";
import { MockLanguageModelV4 } from "ai/test";
import { z } from "zod";

// W1's strings come from bench/w1.py through run.py, so every message has the same size as ours.
if (!process.env.BENCH_W1) {
  console.error("BENCH_W1 is not set: run this through bench/peers/run.py (it passes W1's strings)");
  process.exit(2);
}
const { text: TEXT, user: USER, system: SYSTEM } = JSON.parse(process.env.BENCH_W1);

function args() {
  const out = { jobs: 200, turns: 10, runs: 1, warm: 5 };
  const argv = process.argv.slice(2);
  for (let i = 0; i < argv.length; i += 2) out[argv[i].replace(/^--/, "")] = Number(argv[i + 1]);
  return out;
}

// Stateless, like W1's model: turn k is the number of assistant messages in the prompt it is shown.
// prompt_chars/4 + 1 estimates the input tokens as pipelines.testing.ScriptedModel does (it walks the
// whole history too), so neither side skips work the other one does.
function scriptedModel(turns) {
  return new MockLanguageModelV4({
    doGenerate: async ({ prompt }) => {
      let k = 0;
      let chars = 0;
      for (const m of prompt) {
        if (m.role === "assistant") k += 1;
        if (typeof m.content === "string") chars += m.content.length;
        else for (const p of m.content) if (p.type === "text") chars += p.text.length;
      }
      const usage = {
        inputTokens: { total: Math.floor(chars / 4) + 1, noCache: undefined, cacheRead: undefined, cacheWrite: undefined },
        outputTokens: { total: 51, text: 51, reasoning: undefined },
      };
      if (k >= turns - 1) {
        return { content: [{ type: "text", text: "done" }], finishReason: { unified: "stop", raw: "stop" }, usage, warnings: [] };
      }
      return {
        content: [
          { type: "text", text: TEXT },
          { type: "tool-call", toolCallId: `call_${k}`, toolName: "add", input: JSON.stringify({ a: k, b: 1 }) },
        ],
        finishReason: { unified: "tool-calls", raw: "tool_calls" },
        usage,
        warnings: [],
      };
    },
  });
}

const add = tool({
  description: "Add two integers.",
  inputSchema: z.object({ a: z.number().int(), b: z.number().int() }),
  execute: async ({ a, b }) => ({ sum: a + b }),
});

// cl-pipelines' memory storage drops the checkpoint (the transcript) once a job is done, so the jobs we
// check are watched through their last non-null checkpoint; the others pay no extra bookkeeping.
function watch(storage, ids) {
  const last = new Map();
  const setCheckpoint = storage.setCheckpoint.bind(storage);
  storage.setCheckpoint = async (id, cp) => {
    if (cp && ids.has(id)) last.set(id, cp.state.messages);
    return setCheckpoint(id, cp);
  };
  return last;
}

// A finished W1 job: user, (assistant + tool) x (turns - 1), then "done"; the last tool result is {sum: turns - 1}.
function check(messages, turns) {
  if (!messages || messages.length !== 2 * turns) throw new Error(`unexpected W1 transcript: ${messages?.length} messages`);
  const lastText = messages.at(-1).content;
  const done = typeof lastText === "string" ? lastText : lastText.map((p) => p.text ?? "").join("");
  if (done !== "done") throw new Error(`unexpected last message ${JSON.stringify(messages.at(-1)).slice(0, 200)}`);
  const out = messages.at(-2).content[0].output;
  if (JSON.stringify(out.value) !== JSON.stringify({ sum: turns - 1 })) {
    throw new Error(`unexpected last tool result ${JSON.stringify(out).slice(0, 200)}`);
  }
}

async function runOnce(jobs, turns, tag) {
  const model = scriptedModel(turns);
  const tools = { add };
  const storage = createMemoryStorage();
  const scheduler = createMemoryScheduler();
  const ids = [`${tag}-0`, `${tag}-${jobs - 1}`];
  const transcripts = watch(storage, new Set(ids));
  // The wiring cl-pipelines' docs show for runAgent on the memory adapters.
  const phases = [buildAgentPhase({ model, tools, system: SYSTEM, maxTurns: turns + 1 })];
  scheduler._bind(async (jobId) => advancePhase({ jobId, phases, storage, scheduler }));
  const t0 = performance.now();
  for (let j = 0; j < jobs; j++) {
    await runAgent({
      jobId: `${tag}-${j}`, model, tools, system: SYSTEM, maxTurns: turns + 1,
      initialMessages: [{ role: "user", content: USER }], storage, scheduler,
    });
  }
  await scheduler.drain();
  const seconds = (performance.now() - t0) / 1000;
  for (const id of ids) {
    const job = await storage.getJob(id);
    if (job?.status !== "complete") throw new Error(`job ${id} is ${job?.status}: ${job?.error}`);
    check(transcripts.get(id), turns);
  }
  return seconds;
}

const a = args();
await runOnce(a.warm, a.turns, "warm");
const rates = [];
for (let r = 0; r < a.runs; r++) {
  // Like bench/run.py's timed(): start each run from a collected heap when the runtime lets us.
  if (globalThis.gc) globalThis.gc();
  rates.push((a.jobs * a.turns) / (await runOnce(a.jobs, a.turns, `r${r}`)));
}
// Read from the installed files (the packages do not export their package.json).
const version = (name) => JSON.parse(readFileSync(new URL(`./node_modules/${name}/package.json`, import.meta.url))).version;
const versions = Object.fromEntries(["@claritylabs/cl-pipelines", "ai", "zod"].map((n) => [n, version(n)]));
console.log(JSON.stringify({ peer: "cl-pipelines", turns_per_s: rates, node: process.version, versions }));
