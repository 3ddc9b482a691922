// The TypeScript client against a live `forge serve` (tests/test_ts_client.py starts it and
// passes FORGE_URL, FORGE_ADMIN_KEY and FORGE_AGENT_KEY): the Python client's behaviour tests.
import assert from "node:assert/strict";
import { test } from "node:test";

import { AccessError, Client, ConflictError, JobError, NotFoundError, ValidationError } from "../src/index.js";

const url = process.env.FORGE_URL!;
const admin = new Client(url, process.env.FORGE_ADMIN_KEY);
const agent = new Client(url, process.env.FORGE_AGENT_KEY);
const other = new Client(url, process.env.FORGE_OTHER_KEY);
const FACT = "The build server restarts on Sundays";

test("whoami names the key's agent", async () => {
  assert.equal((await agent.whoami()).agent, "scout");
  assert.equal((await admin.whoami()).admin, true);
});

test("add admits: the same fact twice is one unit, and the answer says so", async () => {
  const [first] = await agent.admit([{ content: FACT }]);
  assert.equal(first.action, "add");
  assert.equal(first.summary, "added");
  const [again] = await agent.admit({ content: FACT });
  assert.equal(again.action, "noop");
  assert.equal(again.summary, `merged into ${first.unit_id}`);
  assert.deepEqual(await agent.add({ content: FACT }), [first.unit_id]);
  const hits = await agent.recall("build server restarts", { k: 3 });
  assert.equal(hits.filter((h) => h.unit.content === FACT).length, 1);
  const [update] = await agent.admit({ content: "The build server restarts on Mondays" });
  assert.equal(update.action, "update");
  assert.equal(update.existing, first.unit_id);
  const raw = await agent.add([{ content: "twice" }, { content: "twice" }], { admit: false });
  assert.notEqual(raw[0], raw[1]);
});

test("recall, context, relations, trace, status and events mirror the Python client", async () => {
  const [rule, fact] = await agent.add([
    { content: "When the ice is thin, step back and test it.", kind: "rule", context: { domain: "lake", task: "", role: "", tags: ["safety"] } },
    { content: "Thin ice cracks with a booming sound." },
  ]);
  const got = await agent.recall("thin ice", { k: 5 });
  assert.ok(got.length >= 2 && got.every((r) => r.score >= 0 && r.score <= 1 && r.reasons.length > 0));
  assert.ok((await agent.recall("thin ice", { k: 5, minScore: 0.99 })).every((r) => r.score >= 0.99));
  assert.match((await agent.context("thin ice", { budget: 200 })).prompt, /step back/);
  const rel = await agent.relate(fact, rule, "supports", { note: "same hazard" });
  assert.equal(rel.type, "supports");
  assert.equal((await agent.relations(rule))[0].note, "same hazard");
  assert.equal(((await agent.trace(rule)) as { source: string }).source, "api:scout");
  assert.equal((await agent.get(rule)).owner, "scout");
  assert.ok((await agent.list({ kinds: ["rule"] })).some((u) => u.id === rule));
  const archived = await agent.setStatus(rule, "archived", "wrong lake");
  assert.equal(archived.status, "archived");
  assert.ok(!(await agent.recall("thin ice", { k: 5, filter: { kinds: ["rule"] } })).some((r) => r.unit.id === rule));
  assert.ok((await agent.events({ op: ["status"] })).some((e) => e.unit_id === rule && e.data.reason === "wrong lake"));
  const eid = await agent.addEpisode({ task: "cross", env: "ice", steps: [{ action: "left", reward: 1, observation: "", thought: "", role: "", info: {} }], outcome: {}, meta: {} });
  assert.equal((await agent.getEpisode(eid)).agent, "scout");
  assert.equal(typeof (await agent.stats()).units, "number");
});

test("errors are the server's, as classes", async () => {
  await assert.rejects(agent.get("missing"), NotFoundError);
  await assert.rejects(agent.recall(""), ValidationError);
  const [id] = await agent.add({ content: "a unit with a fixed id", id: "ts-fixed-id" });
  assert.equal(id, "ts-fixed-id");
  await assert.rejects(agent.add({ content: "another text", id: "ts-fixed-id" }), ConflictError);
  await assert.rejects(new Client(url, "fk_nope_nope").whoami(), AccessError);
  await assert.rejects(agent.erase(id, "not mine to erase"), (err: AccessError) => err instanceof AccessError && err.status === 403);
});

test("erase, export and import with an admin key", async () => {
  const [id] = await admin.add({ content: "Marigold's passport number is X9931-QZ." });
  const done = await admin.erase(id, "erasure request 12");
  assert.equal(done.erased, id);
  assert.equal(done.reason, "erasure request 12");
  await assert.rejects(admin.get(id), NotFoundError);
  const records = [];
  for await (const r of admin.export()) records.push(r);
  assert.ok(records.some((r) => r.record === "unit"));
  assert.ok(!JSON.stringify(records).includes("X9931"));
  await assert.rejects(async () => { for await (const _ of agent.export()) { /* refused */ } }, AccessError);
});

test("a conversation goes through the server's LLM and admission", async () => {
  const got = await agent.addMessages([{ role: "user", content: "I'm vegetarian and I live in Lisbon." }]);
  assert.equal(got.model, "scripted");
  assert.ok(Array.isArray(got.extracted) && Array.isArray(got.ids));
});

test("an outcome credits the units a context showed, once, and only its own agent's", async () => {
  const [rule] = await agent.add({ content: "When the pump hums, close the valve before restarting it.", kind: "rule",
    context: { domain: "plant", task: "", role: "", tags: [] } });
  const ctx = await agent.context("the pump hums", { budget: 300 });
  assert.ok(ctx.recallId.length > 0 && ctx.recallId === ctx.recall_id);
  assert.ok(ctx.units.includes(rule));
  assert.ok(Array.isArray(ctx.rules) && ctx.rules.every((r) => typeof r.when === "string" && Array.isArray(r.avoid) && Array.isArray(r.prefer)
    && typeof r.validation === "number"));
  await assert.rejects(other.outcome(ctx.recallId, { success: true }), AccessError);
  const credit = await agent.outcome(ctx.recallId, { success: false, feedback: "the valve was already closed" });
  assert.equal(credit.recall_id, ctx.recallId);
  assert.equal(credit.success, false);
  assert.ok(credit.credited.includes(rule));
  await assert.rejects(agent.outcome(ctx.recallId, { success: true }), ConflictError);
  await assert.rejects(agent.outcome("no-such-recall", { success: true }), NotFoundError);
  const hits = await agent.recall("pump valve", { k: 3 });
  assert.ok(hits.recallId.length > 0 && hits.recallId !== ctx.recallId && hits.length > 0);
  assert.equal((await admin.recall("pump valve", { k: 3 })).recallId, "");
});

test("learn queues a job on the trace and its outcome; the job says what came of it", async () => {
  const ctx = await agent.context("restart the pump");
  const queued = await agent.learn({
    task: "Restart pump 4 after the alarm", kind: "ops",
    steps: [{ type: "message", role: "user", content: "Pump 4 alarms; restart it." },
      { type: "tool", tool: "restart_pump", args: { pump: 4 }, error: "valve open" },
      { type: "answer", content: "Could not restart: the valve was open." }],
    answer: "Could not restart: the valve was open.", recall_ids: [ctx.recallId],
  }, { success: false, feedback: "close the valve first" });
  assert.equal(queued.status, "queued");
  assert.equal(queued.url, `/v1/jobs/${queued.job_id}`);
  const job = await agent.waitForJob(queued.job_id, { timeoutMs: 60_000 });
  assert.equal(job.status, "done");
  assert.ok(job.result && Array.isArray(job.result.learned) && Array.isArray(job.result.credited) && Array.isArray(job.result.shared));
  assert.equal((await agent.job(queued.job_id)).status, "done");
  const waited = await agent.learn({ task: "Check the pump", answer: "fine" }, { success: true }, { wait: true, timeoutMs: 60_000 });
  assert.equal(waited.status, "done");
  await assert.rejects(agent.job("no-such-job"), NotFoundError);
  await assert.rejects(agent.learn({ task: "", steps: [{ type: "dance" as "message" }] }), ValidationError);
  assert.ok(new JobError("x", job) instanceof Error);
});
