// strom's RecordService from Node.js: nothing but the .proto files and @grpc/grpc-js.
//
// The helpers here are what a Node.js service needs (docs/grpc-clients.md shows the same code):
// load the protos, make a client, produce with retries of the retriable codes, murmur2 for
// callers that pick partitions themselves, and a line protocol (JSON on stdout, commands on
// stdin) through which the pytest integration tests drive these programs.
'use strict';

const path = require('path');
const readline = require('readline');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PROTO_DIR = path.resolve(__dirname, '..', '..', '..', 'protos');

// keepCase: field names as in the .proto (snake_case); longs: int64 as JS numbers (offsets and
// timestamps stay far below 2^53); enums as their names; oneofs: msg.event says which is set.
const LOADER_OPTIONS = {
  keepCase: true,
  longs: Number,
  enums: String,
  defaults: true,
  oneofs: true,
  includeDirs: [PROTO_DIR],
};

function loadApi() {
  const def = protoLoader.loadSync(
    ['strom/v1/records.proto', 'strom/v1/storage.proto'],
    LOADER_OPTIONS,
  );
  return grpc.loadPackageDefinition(def).strom.v1;
}

const api = loadApi();

// Messages up to 64 MiB (a Subscribe message is at most max_bytes_per_message).
const CHANNEL_OPTIONS = {
  'grpc.max_receive_message_length': 64 * 1024 * 1024,
  'grpc.max_send_message_length': 64 * 1024 * 1024,
  // An address list (`ipv4:a:p,b:p`, or a DNS name with several addresses) spreads calls over
  // the nodes: any node takes any call (docs/grpc-clients.md, "Spreading calls").
  'grpc.service_config': JSON.stringify({ loadBalancingConfig: [{ round_robin: {} }] }),
};

function recordClient(address) {
  return new api.RecordService(address, grpc.credentials.createInsecure(), CHANNEL_OPTIONS);
}

function storageClient(address) {
  return new api.StorageService(address, grpc.credentials.createInsecure(), CHANNEL_OPTIONS);
}

function unary(client, method, request, deadlineMs = 60000) {
  return new Promise((resolve, reject) => {
    client[method](request, { deadline: Date.now() + deadlineMs }, (err, resp) =>
      err ? reject(err) : resolve(resp),
    );
  });
}

// Codes the docs call retriable for ProduceRecords (retry the same call after a backoff).
const RETRIABLE = new Set([
  'REQUEST_TIMED_OUT',
  'UNKNOWN_TOPIC_OR_PARTITION',
  'NOT_LEADER_OR_FOLLOWER',
  'LEADER_NOT_AVAILABLE',
  'NOT_ENOUGH_REPLICAS',
  'NOT_ENOUGH_REPLICAS_AFTER_APPEND',
  'BROKER_NOT_AVAILABLE',
  'FENCED_LEADER_EPOCH',
  'UNKNOWN_LEADER_EPOCH',
  'REPLICA_NOT_AVAILABLE',
  'STORAGE_ERROR',
  'COORDINATOR_NOT_AVAILABLE',
  'COORDINATOR_LOAD_IN_PROGRESS',
  'NOT_COORDINATOR',
]);
const RETRIABLE_STATUS = new Set([grpc.status.UNAVAILABLE, grpc.status.DEADLINE_EXCEEDED]);

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// The records at `idx` (indexes into `cols`, ascending) as columns of their own: keys,
// values, timestamps, headers and null lists picked as RecordColumns lays them out.
function pickColumns(cols, idx) {
  const per = (a) => (a && a.length ? idx.map((i) => a[i]) : []);
  const out = { keys: per(cols.keys), values: per(cols.values), timestamps: per(cols.timestamps) };
  const counts = cols.header_counts || [];
  if (counts.length) {
    const starts = [];
    for (let i = 0, h = 0; i < counts.length; h += counts[i], i++) starts.push(h);
    out.header_counts = idx.map((i) => counts[i]);
    out.header_keys = [];
    out.header_values = [];
    for (const i of idx) {
      for (let h = starts[i]; h < starts[i] + counts[i]; h++) {
        out.header_keys.push(cols.header_keys[h]);
        out.header_values.push(cols.header_values[h]);
      }
    }
  }
  const where = new Map(idx.map((i, j) => [i, j]));
  for (const name of ['null_keys', 'null_values']) {
    const picked = (cols[name] || []).filter((i) => where.has(i)).map((i) => where.get(i));
    if (picked.length) out[name] = picked;
  }
  return out;
}

// ProduceRecords, retrying what failed retriably (use it with the caller's producer sequence,
// or accept that a retry after a timeout may duplicate). Only the records of the partitions
// that failed are sent again (FIX (found from outside): the whole call was resent, so every
// partition that had succeeded was written once more per attempt); the answer merges the
// attempts, in request order. A failure that is not retriable, or the last attempt's, throws
// an Error naming each failed partition; its `response` holds what was written.
async function produceRecords(client, request, { attempts = 100, backoffMs = 100 } = {}) {
  const n = request.records.values.length;
  const merged = {
    error_code: 'NONE',
    error_message: '',
    partitions: new Array(n).fill(-1),
    offsets: new Array(n).fill(-1),
    results: [],
  };
  const results = new Map(); // partition -> its latest result
  let todo = null; // indexes of the records still to send (null: all of them)
  let call = request;
  for (let i = 1; ; i++) {
    let resp;
    try {
      resp = await unary(client, 'ProduceRecords', call);
    } catch (err) {
      if (!RETRIABLE_STATUS.has(err.code) || i >= attempts) throw err;
      await sleep(backoffMs);
      continue;
    }
    if (resp.error_code !== 'NONE') { // the whole call (nothing was written)
      if (!RETRIABLE.has(resp.error_code) || i >= attempts) {
        const err = new Error(`ProduceRecords failed: ${resp.error_code}: ${resp.error_message}`);
        err.response = merged;
        throw err;
      }
      await sleep(backoffMs);
      continue;
    }
    const failed = new Map();
    for (const r of resp.results) {
      results.set(r.partition, r);
      if (r.error_code !== 'NONE') failed.set(r.partition, r);
    }
    const again = [];
    for (let j = 0; j < resp.partitions.length; j++) {
      const at = todo ? todo[j] : j;
      merged.partitions[at] = resp.partitions[j];
      merged.offsets[at] = resp.offsets[j];
      if (failed.has(resp.partitions[j])) again.push(at);
    }
    merged.results = [...results.values()].sort((a, b) => a.partition - b.partition);
    if (!failed.size) return merged;
    const fatal = [...failed.values()].some((r) => !RETRIABLE.has(r.error_code));
    if (fatal || i >= attempts) {
      const detail = [...failed.values()]
        .map((r) => `partition ${r.partition}: ${r.error_code}${r.error_message ? ` (${r.error_message})` : ''}`)
        .join('; ');
      const err = new Error(`ProduceRecords failed: ${detail}`);
      err.response = merged;
      throw err;
    }
    todo = again;
    call = { ...request, records: pickColumns(request.records, again) };
    await sleep(backoffMs);
  }
}

// Kafka's murmur2 (what strom and Kafka's Java client hash keys with).
function murmur2(buf) {
  const m = 0x5bd1e995;
  let h = (0x9747b28c ^ buf.length) >>> 0;
  const tail = buf.length & ~3;
  for (let i = 0; i < tail; i += 4) {
    let k = buf.readUInt32LE(i);
    k = Math.imul(k, m);
    k ^= k >>> 24;
    k = Math.imul(k, m);
    h = Math.imul(h, m) ^ k;
  }
  switch (buf.length & 3) {
    case 3:
      h ^= buf[tail + 2] << 16;
    // falls through
    case 2:
      h ^= buf[tail + 1] << 8;
    // falls through
    case 1:
      h ^= buf[tail];
      h = Math.imul(h, m);
  }
  h ^= h >>> 13;
  h = Math.imul(h, m);
  h ^= h >>> 15;
  return h >>> 0;
}

function partitionForKey(key, numPartitions) {
  return (murmur2(key) & 0x7fffffff) % numPartitions;
}

// Sending each record to its partition's leader, as Kafka clients do (docs/grpc-clients.md,
// "Sending to the leader"). Any node takes any ProduceRecords call and forwards what it does not
// lead; a caller that sends each key to the leader of its partition saves that forward (about
// half of a small call's latency and a quarter of the nodes' CPU). The routes come from
// StorageService.Metadata; a stale route costs a forward, never a record, and is refreshed when
// `maxAgeMs` passed or when asked (`leaders(topic, { refresh: true })`, e.g. after a failed call).
class LeaderRouter {
  constructor(bootstrap, { maxAgeMs = 30000 } = {}) {
    this.bootstrap = storageClient(bootstrap);
    this.maxAgeMs = maxAgeMs;
    this.clients = new Map(); // address -> RecordService client of that node alone
    this.routes = new Map(); // topic -> { leaders: [address], at }
  }

  // The address of each partition's leader (index = partition), from a Metadata call.
  async leaders(topic, { refresh = false } = {}) {
    const known = this.routes.get(topic);
    if (known && !refresh && Date.now() - known.at < this.maxAgeMs) return known.leaders;
    const md = await unary(this.bootstrap, 'Metadata', { topics: [topic] });
    const nodes = new Map(md.nodes.map((n) => [n.node_id, `${n.host}:${n.port}`]));
    const t = md.topics.find((x) => x.name === topic);
    if (!t || t.error_code !== 'NONE') {
      throw new Error(`Metadata for ${topic}: ${t ? `${t.error_code} ${t.error_message}` : 'missing'}`);
    }
    // Indexed by partition number; a partition without a live leader (or missing from the
    // answer) goes to any node, which answers or forwards.
    const any = md.nodes.length ? `${md.nodes[0].host}:${md.nodes[0].port}` : null;
    const count = t.partitions.reduce((n, p) => Math.max(n, p.partition + 1), 0);
    const leaders = new Array(count).fill(any);
    for (const p of t.partitions) leaders[p.partition] = nodes.get(p.leader) || any;
    this.routes.set(topic, { leaders, at: Date.now() });
    return leaders;
  }

  // The RecordService client of one node (no load balancing: the call goes where it is sent).
  client(address) {
    let c = this.clients.get(address);
    if (!c) {
      c = new api.RecordService(address, grpc.credentials.createInsecure(), {
        'grpc.max_receive_message_length': CHANNEL_OPTIONS['grpc.max_receive_message_length'],
        'grpc.max_send_message_length': CHANNEL_OPTIONS['grpc.max_send_message_length'],
      });
      this.clients.set(address, c);
    }
    return c;
  }

  // The leader's address for a key of `topic` (murmur2, as the node itself would choose).
  async addressForKey(topic, key) {
    const leaders = await this.leaders(topic);
    return leaders[partitionForKey(key, leaders.length)];
  }

  close() {
    this.bootstrap.close();
    for (const c of this.clients.values()) c.close();
  }
}

// Which records go to which leader: `leaders` from LeaderRouter.leaders(topic), `keys` the
// records' keys; a Map of leader address -> the indexes of its records, in their order.
function splitByLeader(leaders, keys) {
  const byLeader = new Map();
  for (let i = 0; i < keys.length; i++) {
    const addr = leaders[partitionForKey(keys[i], leaders.length)];
    if (!byLeader.has(addr)) byLeader.set(addr, []);
    byLeader.get(addr).push(i);
  }
  return byLeader;
}

// One JSON object per line on stdout: the test reads these.
function emit(obj) {
  process.stdout.write(JSON.stringify(obj) + '\n');
}

// Commands from the test, one per line on stdin.
function onCommand(handler) {
  const rl = readline.createInterface({ input: process.stdin });
  rl.on('line', (line) => handler(line.trim()));
  return rl;
}

function args(argv = process.argv.slice(2)) {
  const out = {};
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (!a.startsWith('--')) throw new Error(`unexpected argument ${a}`);
    const name = a.slice(2);
    const next = argv[i + 1];
    if (next === undefined || next.startsWith('--')) out[name] = true;
    else {
      out[name] = next;
      i++;
    }
  }
  return out;
}

// Records of one Subscribe message as [{offset, key, value, timestamp, headers}], nulls as null.
function recordsOf(msg) {
  const cols = msg.records;
  const nullKeys = new Set(cols.null_keys);
  const nullValues = new Set(cols.null_values);
  const out = [];
  let h = 0;
  for (let i = 0; i < cols.values.length; i++) {
    const count = cols.header_counts.length ? cols.header_counts[i] : 0;
    const headers = [];
    for (let j = 0; j < count; j++, h++) headers.push([cols.header_keys[h], cols.header_values[h]]);
    out.push({
      offset: msg.offsets[i],
      key: cols.keys.length && !nullKeys.has(i) ? cols.keys[i] : null,
      value: nullValues.has(i) ? null : cols.values[i],
      timestamp: cols.timestamps[i],
      headers,
    });
  }
  return out;
}

module.exports = {
  api,
  grpc,
  recordClient,
  storageClient,
  unary,
  produceRecords,
  murmur2,
  partitionForKey,
  LeaderRouter,
  splitByLeader,
  emit,
  onCommand,
  args,
  recordsOf,
  sleep,
  RETRIABLE,
};
