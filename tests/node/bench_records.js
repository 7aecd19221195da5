// The Node.js caller of `strom bench grpc-records` (services/strom/bench/grpc_records.py):
//
// 1. ProduceRecords: --records keyed records of --record-size bytes in calls of --batch, with
//    --in-flight calls outstanding (records/s);
// 2. Subscribe: reads those records back from the earliest offset (records/s), up to
//    --max-records-per-message records per stream message;
// 3. with --latency-topic: end-to-end latency, one record per ProduceRecords call at --rate
//    records/s for --latency-records records, received on a Subscribe stream opened first
//    (latest); latency = receive time - send time, in ms.
//
// Prints one JSON line: {"produce": {...}, "subscribe": {...}, "latency_ms": [...]}.
'use strict';

const {
  recordClient, unary, emit, args, sleep, LeaderRouter, partitionForKey,
} = require('./lib/strom');

const a = args();
const client = recordClient(a.address);
const total = Number(a.records);
const batch = Number(a.batch || 1000);
const inFlight = Number(a['in-flight'] || 4);
const size = Number(a['record-size'] || 100);
const nkeys = Number(a.keys || 1000);
// --route any: every call to the address given (round_robin over a list), the node forwards
// what it does not lead; --route leaders: each key to its partition's leader (LeaderRouter).
const routeLeaders = (a.route || 'any') === 'leaders';
const router = routeLeaders ? new LeaderRouter(a.address) : null;

function request(start, n) {
  const keys = [];
  const values = [];
  const pad = Buffer.alloc(size, 'x');
  for (let i = start; i < start + n; i++) {
    keys.push(Buffer.from(`key-${i % nkeys}`));
    values.push(pad);
  }
  return { topic: a.topic, records: { keys, values } };
}

function check(resp) {
  const bad = resp.error_code !== 'NONE' || resp.results.some((r) => r.error_code !== 'NONE');
  if (bad) throw new Error(`ProduceRecords failed: ${JSON.stringify(resp)}`);
}

// --route leaders: the records, in order, gathered per leader; a call goes out when a leader
// has --batch records (so calls still carry --batch records each), --in-flight at most.
async function produceToLeaders() {
  const leaders = await router.leaders(a.topic);
  const pad = Buffer.alloc(size, 'x');
  for (const addr of new Set(leaders)) {
    await unary(router.client(addr), 'ProduceRecords', { topic: a.topic, records: { values: [pad] } });
  }
  const pending = new Set();
  const buffers = new Map();
  let done = leaders.length ? new Set(leaders).size : 0;
  async function send(addr, keys, values) {
    while (pending.size >= inFlight) await Promise.race(pending);
    const p = unary(router.client(addr), 'ProduceRecords', { topic: a.topic, records: { keys, values } })
      .then((resp) => { check(resp); done += keys.length; })
      .finally(() => pending.delete(p));
    pending.add(p);
  }
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < total; i++) {
    const key = Buffer.from(`key-${i % nkeys}`);
    const addr = leaders[partitionForKey(key, leaders.length)];
    let buf = buffers.get(addr);
    if (!buf) buffers.set(addr, (buf = { keys: [], values: [] }));
    buf.keys.push(key);
    buf.values.push(pad);
    if (buf.keys.length >= batch) {
      buffers.delete(addr);
      await send(addr, buf.keys, buf.values);
    }
  }
  for (const [addr, buf] of buffers) await send(addr, buf.keys, buf.values);
  await Promise.all(pending);
  return { records: done, seconds: Number(process.hrtime.bigint() - t0) / 1e9 };
}

async function produce() {
  if (routeLeaders) return produceToLeaders();
  await unary(client, 'ProduceRecords', request(0, 1)); // warm: connection and metadata
  let next = 0;
  let done = 0;
  const t0 = process.hrtime.bigint();
  async function worker() {
    while (next < total) {
      const start = next;
      const n = Math.min(batch, total - start);
      next += n;
      const resp = await unary(client, 'ProduceRecords', request(start, n));
      const bad = resp.error_code !== 'NONE' || resp.results.some((r) => r.error_code !== 'NONE');
      if (bad) throw new Error(`ProduceRecords failed: ${JSON.stringify(resp)}`);
      done += n;
    }
  }
  await Promise.all(Array.from({ length: inFlight }, worker));
  return { records: done + 1, seconds: Number(process.hrtime.bigint() - t0) / 1e9 };
}

function subscribe(want) {
  return new Promise((resolve, reject) => {
    let got = 0;
    let bytes = 0;
    let t0 = null;
    const req = { topics: [a.topic], start: 'START_POSITION_EARLIEST' };
    if (a['max-records-per-message']) {
      req.max_records_per_message = Number(a['max-records-per-message']);
    }
    const call = client.Subscribe(req);
    call.on('data', (msg) => {
      if (msg.event !== 'records') return;
      if (t0 === null) t0 = process.hrtime.bigint();
      got += msg.records.offsets.length;
      for (const v of msg.records.records.values) bytes += v.length;
      if (got >= want) {
        call.cancel();
        resolve({ records: got, bytes, seconds: Number(process.hrtime.bigint() - t0) / 1e9 });
      }
    });
    call.on('error', (err) => {
      if (err.code !== 1) reject(err);
    });
  });
}

async function latency() {
  const n = Number(a['latency-records'] || 2000);
  const rate = Number(a.rate || 200);
  const lat = [];
  let assigned;
  const ready = new Promise((r) => { assigned = r; });
  const call = client.Subscribe({ topics: [a['latency-topic']], start: 'START_POSITION_LATEST' });
  let received = 0;
  let finished;
  const all = new Promise((r) => { finished = r; });
  call.on('data', (msg) => {
    if (msg.event === 'assignment') {
      assigned();
      return;
    }
    const now = process.hrtime.bigint();
    for (const v of msg.records.records.values) {
      const sent = BigInt(v.toString().split('|')[1]);
      lat.push(Number(now - sent) / 1e6);
      received++;
    }
    if (received >= n) finished();
  });
  call.on('error', (err) => {
    if (err.code !== 1) finished();
  });
  await ready; // the first message comes once "latest" is resolved: records from now on
  // --route leaders: keyless records spread over the partitions, each to its leader.
  const leaders = routeLeaders ? await router.leaders(a['latency-topic']) : null;
  const t0 = Date.now();
  const pending = [];
  for (let i = 0; i < n; i++) {
    const due = t0 + (i * 1000) / rate;
    const wait = due - Date.now();
    if (wait > 0) await sleep(wait);
    const value = Buffer.from(`${i}|${process.hrtime.bigint()}|`.padEnd(size, 'x'));
    const req = { topic: a['latency-topic'], records: { values: [value] } };
    if (leaders) {
      req.partition = i % leaders.length;
      pending.push(unary(router.client(leaders[req.partition]), 'ProduceRecords', req));
    } else {
      pending.push(unary(client, 'ProduceRecords', req));
    }
  }
  await Promise.all(pending);
  await Promise.race([all, sleep(30000)]);
  call.cancel();
  return lat;
}

(async () => {
  const out = {};
  if (total > 0) {
    out.produce = await produce();
    out.subscribe = await subscribe(out.produce.records);
  }
  if (a['latency-topic']) out.latency_ms = await latency();
  emit(out);
  process.exit(0);
})().catch((err) => {
  emit({ error: String(err.stack || err) });
  process.exit(1);
});
