// Produces --records keyed records with ProduceRecords (--batch records per call, one call in
// flight, so every key's records are written in the order they were made; with --route leaders
// each call is split by partition leader and sent to the leaders themselves), then reads the
// topic back with Subscribe and checks every record: the partition (murmur2 of the key, as
// computed here in JavaScript), the offset the produce call reported, the order per key, and
// the exact key, value, timestamp and headers. Prints one JSON summary line.
'use strict';

const {
  recordClient, produceRecords, partitionForKey, emit, args, recordsOf, LeaderRouter,
  splitByLeader,
} = require('./lib/strom');

const a = args();
const client = recordClient(a.address);
const topic = a.topic;
const total = Number(a.records);
const nkeys = Number(a.keys);
const batch = Number(a.batch || 1000);
const numPartitions = Number(a.partitions);
const BASE_TS = 1_700_000_000_000;
const router = (a.route || 'any') === 'leaders' ? new LeaderRouter(a.address) : null;

// Record i: key k = i % nkeys, its seq-th record with seq = floor(i / nkeys).
const keyOf = (i) => Buffer.from(`key-${i % nkeys}`);
const valueOf = (i) => {
  const filler = ((Math.imul(i, 2654435761) >>> 0).toString(16).padStart(8, '0')).repeat(10);
  return Buffer.from(`key-${i % nkeys}|${Math.floor(i / nkeys)}|${filler}`);
};
// Every 7th record carries two headers (null keys and values are covered by the Python tests).
const headersOf = (i) => (i % 7 === 0 ? [['i', Buffer.from(String(i))], ['src', Buffer.from('node')]] : []);

// One ProduceRecords call of records `idx` through `cl`; their offsets into `offsets`.
async function produceCall(cl, idx, offsets) {
  const keys = [];
  const values = [];
  const timestamps = [];
  const headerCounts = [];
  const headerKeys = [];
  const headerValues = [];
  for (const i of idx) {
    keys.push(keyOf(i));
    values.push(valueOf(i));
    timestamps.push(BASE_TS + i);
    const hs = headersOf(i);
    headerCounts.push(hs.length);
    for (const [k, v] of hs) {
      headerKeys.push(k);
      headerValues.push(v);
    }
  }
  const resp = await produceRecords(cl, {
    topic,
    records: {
      keys, values, timestamps,
      header_counts: headerCounts, header_keys: headerKeys, header_values: headerValues,
    },
    acks: 'ACKS_ALL',
  });
  let badPartitions = 0;
  for (let j = 0; j < idx.length; j++) {
    offsets[idx[j]] = resp.offsets[j];
    if (resp.partitions[j] !== partitionForKey(keys[j], numPartitions)) badPartitions++;
  }
  return badPartitions;
}

// --route any: each call to --address (the node forwards what it does not lead);
// --route leaders: each call's records split by their partition's leader (LeaderRouter), one
// call per leader, so no node forwards anything.
async function produce() {
  const offsets = new Float64Array(total);
  let badPartitions = 0;
  const t0 = Date.now();
  for (let start = 0; start < total; start += batch) {
    const idx = [];
    for (let i = start; i < Math.min(start + batch, total); i++) idx.push(i);
    if (!router) {
      badPartitions += await produceCall(client, idx, offsets);
      continue;
    }
    const leaders = await router.leaders(topic);
    const byLeader = splitByLeader(leaders, idx.map(keyOf));
    for (const [addr, positions] of byLeader) {
      const part = positions.map((j) => idx[j]);
      badPartitions += await produceCall(router.client(addr), part, offsets);
    }
  }
  return { offsets, badPartitions, seconds: (Date.now() - t0) / 1000 };
}

function read(offsets) {
  return new Promise((resolve, reject) => {
    const t0 = Date.now();
    const lastSeq = new Map();
    const seen = new Uint8Array(total);
    const stats = {
      read: 0, wrong_offset: 0, out_of_order: 0, bad_contents: 0, duplicates: 0, messages: 0,
    };
    const call = client.Subscribe({ topics: [topic], start: 'START_POSITION_EARLIEST' });
    let idle = setTimeout(() => reject(new Error('no records for 60 s')), 60000);
    call.on('data', (msg) => {
      if (msg.event !== 'records') return;
      clearTimeout(idle);
      idle = setTimeout(() => reject(new Error('no records for 60 s')), 60000);
      stats.messages++;
      for (const r of recordsOf(msg.records)) {
        const [key, seqText] = r.value.toString().split('|');
        const seq = Number(seqText);
        const i = seq * nkeys + Number(key.slice(4));
        stats.read++;
        if (!(i >= 0 && i < total) || seen[i]) {
          stats.duplicates++;
          continue;
        }
        seen[i] = 1;
        const hs = headersOf(i);
        const headersOk = r.headers.length === hs.length && hs.every(
          ([k, v], j) => r.headers[j][0] === k && r.headers[j][1].equals(v));
        if (!r.key || !r.key.equals(keyOf(i)) || !r.value.equals(valueOf(i))
            || r.timestamp !== BASE_TS + i || !headersOk) stats.bad_contents++;
        if (r.offset !== offsets[i]) stats.wrong_offset++;
        const prev = lastSeq.has(key) ? lastSeq.get(key) : -1;
        if (seq !== prev + 1) stats.out_of_order++;
        lastSeq.set(key, seq);
      }
      if (stats.read >= total) {
        clearTimeout(idle);
        call.cancel();
        stats.missing = total - seen.reduce((s, x) => s + x, 0);
        stats.seconds = (Date.now() - t0) / 1000;
        resolve(stats);
      }
    });
    call.on('error', (err) => {
      if (err.code !== 1) reject(err); // 1 = CANCELLED, by us above
    });
  });
}

(async () => {
  const p = await produce();
  const r = await read(p.offsets);
  emit({
    produced: total,
    bad_partitions: p.badPartitions,
    produce_seconds: p.seconds,
    read_seconds: r.seconds,
    ...r,
  });
  process.exit(0);
})().catch((err) => {
  emit({ error: String(err.stack || err) });
  process.exit(1);
});
