// A complete Node.js client of strom's RecordService: produce keyed records, then read them
// back as a member of a consumer group, committing after each message (at-least-once). It
// reads from the start of the topic and stops after as many records as it produced: give it
// a new topic to see its own records.
// docs/grpc-clients.md shows this file; tests/integration/test_records_node.py runs it.
//
//   npm install @grpc/grpc-js @grpc/proto-loader
//   node example.js 127.0.0.1:9092 /path/to/strom/protos clicks
'use strict';

const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const [address = '127.0.0.1:9092', protoDir = '../../protos', topic = 'clicks'] =
  process.argv.slice(2);

// The .proto files are the client library: load them, keep field names as written there,
// int64 as JS numbers (offsets and ms timestamps stay far below 2^53), enums as names.
const definition = protoLoader.loadSync('strom/v1/records.proto', {
  includeDirs: [protoDir],
  keepCase: true,
  longs: Number,
  enums: String,
  defaults: true,
  oneofs: true,
});
const strom = grpc.loadPackageDefinition(definition).strom.v1;
// `address` may list every node (`ipv4:10.0.0.11:9092,10.0.0.12:9092`, or a DNS name with
// several addresses). Two channels over them:
// - `spread` (round_robin): each ProduceRecords goes to the next node, as any node takes it;
// - `member` (pick_first: one node for every call): a subscription lives in the node serving
//   its Subscribe stream, so its CommitOffsets must reach that same node.
// Both: keepalive pings every 10 s (the nodes accept them down to 10 s), the only way a client
// notices a node that hangs or is cut off, and a DNS name looked up again a second after a
// node went away (gRPC waits 30 s: a node restarted at a new IP under its name, a Kubernetes
// pod, would be dialled at its old IP meanwhile); `member` also takes messages of any size,
// since a record up to the topic's max.message.bytes (16 MiB by default) arrives whole, in one
// message, and gRPC refuses messages above 4 MiB by default (the stream would fail on it).
const credentials = grpc.credentials.createInsecure();
const common = {
  'grpc.keepalive_time_ms': 10000,
  'grpc.keepalive_timeout_ms': 5000,
  'grpc.dns_min_time_between_resolutions_ms': 1000,
};
const spread = new strom.RecordService(address, credentials, {
  ...common,
  'grpc.service_config': JSON.stringify({ loadBalancingConfig: [{ round_robin: {} }] }),
});
const member = new strom.RecordService(address, credentials, {
  ...common,
  'grpc.max_receive_message_length': -1,
  'grpc.service_config': JSON.stringify({ loadBalancingConfig: [{ pick_first: {} }] }),
});

function call(client, method, request) {
  return new Promise((resolve, reject) => {
    client[method](request, { deadline: Date.now() + 30000 }, (err, resp) =>
      (err ? reject(err) : resolve(resp)));
  });
}

async function produce() {
  // Records as columns: entry i of each list is record i. No partition given: each record
  // goes to murmur2(key) % partitions, the partition Kafka's and strom's clients pick.
  const keys = [];
  const values = [];
  for (let i = 0; i < 10; i++) {
    keys.push(Buffer.from(`user-${i % 3}`));
    values.push(Buffer.from(JSON.stringify({ click: i })));
  }
  for (let attempt = 1; ; attempt++) {
    const resp = await call(spread, 'ProduceRecords', { topic, records: { keys, values } });
    // Retriable for a topic created a moment ago (not every node knows it yet), but a
    // misspelt topic never appears: give up after a few seconds.
    if (resp.error_code === 'UNKNOWN_TOPIC_OR_PARTITION' && attempt < 25) {
      await new Promise((r) => setTimeout(r, 200));
      continue;
    }
    if (resp.error_code !== 'NONE') throw new Error(`${resp.error_code}: ${resp.error_message}`);
    for (const r of resp.results) {
      if (r.error_code !== 'NONE') throw new Error(`${r.error_code}: ${r.error_message}`);
    }
    resp.partitions.forEach((p, i) => console.log(`produced ${keys[i]} -> ${p}@${resp.offsets[i]}`));
    return resp.offsets.length;
  }
}

function consume(expected) {
  return new Promise((resolve, reject) => {
    let subscription = null;
    let seen = 0;
    let done = false; // set on leaving: messages and commit answers after it are ignored
    const stream = member.Subscribe({
      group_id: 'example-group',
      topics: [topic],
      start: 'START_POSITION_EARLIEST', // where partitions without a committed offset start
    });
    stream.on('data', async (msg) => {
      if (done) return;
      if (msg.event === 'assignment') {
        subscription = msg.assignment.subscription_id; // for CommitOffsets
        return;
      }
      const { partition, offsets, records } = msg.records;
      offsets.forEach((offset, i) => {
        // `keys` is empty when no record of the message has a key.
        const key = records.keys.length ? `${records.keys[i]} ` : '';
        console.log(`consumed ${partition}@${offset} ${key}${records.values[i]}`);
      });
      seen += offsets.length;
      // Processed: commit the next offset to read, on the stream's channel (its node).
      const resp = await call(member, 'CommitOffsets', {
        subscription_id: subscription,
        offsets: [{ topic, partition, offset: offsets[offsets.length - 1] + 1 }],
      });
      if (done) return; // left the group meanwhile: a refused commit no longer matters
      const code = resp.error_code !== 'NONE' ? resp.error_code : resp.results[0].error_code;
      // Not committed: these records will be read again after a restart or a rebalance
      // (at-least-once). STALE_MEMBER_EPOCH: the group moved the partition; drop the commit.
      if (code !== 'NONE') console.log(`commit ${partition}: ${code}`);
      if (seen >= expected) {
        done = true;
        stream.cancel(); // leaves the group: the partitions move to the other members
        resolve(seen);
      }
    });
    stream.on('error', (err) => {
      if (err.code !== grpc.status.CANCELLED) reject(err);
    });
  });
}

produce()
  .then(consume)
  .then((n) => {
    console.log(`done: ${n} records`);
    spread.close();
    member.close();
  })
  .catch((err) => {
    console.error(err);
    process.exit(1);
  });
