// A long-lived subscription while a partition leader dies: this program produces numbered
// records with ProduceRecords (one call of --batch records in flight, keyless, so calls go
// round the partitions) and reads the topic with one Subscribe stream from the start, both
// through the node at --address. The test SIGKILLs another node (a partition leader) meanwhile.
//
// Prints {"event":"progress","acked":n,"received":m} every 200 ms. On the "stop" command it
// stops producing, waits until every acknowledged record has arrived (up to 60 s) and prints
// {"event":"summary",...}: missing and duplicate records, records out of order within a
// partition, the longest pause between stream messages (overall, and between two messages of
// one partition), and whether the stream ever ended.
'use strict';

const {
  recordClient, produceRecords, emit, onCommand, args, sleep,
} = require('./lib/strom');

const a = args();
const client = recordClient(a.address);
const batch = Number(a.batch || 100);

let producing = true;
let acked = 0; // records 0..acked-1 are acknowledged
let produceErrors = 0;
const received = new Map(); // seq -> count
const lastOffset = new Map(); // partition -> last offset seen
let outOfOrder = 0;
let messages = 0;
let lastMessageAt = null;
let maxPauseMs = 0;
const lastPartitionAt = new Map(); // partition -> time of its last message
let maxPartitionPauseMs = 0;
let streamEnded = null;

const call = client.Subscribe({ topics: [a.topic], start: 'START_POSITION_EARLIEST' });
call.on('data', (msg) => {
  if (msg.event !== 'records') return;
  const now = Date.now();
  if (lastMessageAt !== null) maxPauseMs = Math.max(maxPauseMs, now - lastMessageAt);
  lastMessageAt = now;
  messages++;
  const r = msg.records;
  if (lastPartitionAt.has(r.partition)) {
    maxPartitionPauseMs = Math.max(maxPartitionPauseMs, now - lastPartitionAt.get(r.partition));
  }
  lastPartitionAt.set(r.partition, now);
  for (let i = 0; i < r.offsets.length; i++) {
    const prev = lastOffset.has(r.partition) ? lastOffset.get(r.partition) : -1;
    if (r.offsets[i] <= prev) outOfOrder++;
    lastOffset.set(r.partition, r.offsets[i]);
    const seq = Number(r.records.values[i].toString());
    received.set(seq, (received.get(seq) || 0) + 1);
  }
});
call.on('error', (err) => {
  streamEnded = `${err.code} ${err.details}`;
});
call.on('end', () => {
  streamEnded = 'ended';
});

async function produce() {
  while (producing) {
    const values = [];
    for (let i = 0; i < batch; i++) values.push(Buffer.from(String(acked + i)));
    try {
      await produceRecords(client, { topic: a.topic, records: { values } });
      acked += batch;
    } catch (err) {
      produceErrors++;
      emit({ event: 'produce_error', error: String(err.details || err.message || err) });
      await sleep(100);
    }
  }
}

const ticker = setInterval(() => {
  emit({ event: 'progress', acked, received: received.size, messages });
}, 200);

onCommand(async (cmd) => {
  if (cmd !== 'stop') return;
  producing = false;
  await producer;
  const deadline = Date.now() + 60000;
  while (Date.now() < deadline && streamEnded === null) {
    let all = true;
    for (let s = 0; s < acked; s++) if (!received.has(s)) { all = false; break; }
    if (all) break;
    await sleep(50);
  }
  clearInterval(ticker);
  let missing = 0;
  let duplicates = 0;
  for (let s = 0; s < acked; s++) {
    const c = received.get(s) || 0;
    if (c === 0) missing++;
    if (c > 1) duplicates += c - 1;
  }
  emit({
    event: 'summary', acked, received: received.size, missing, duplicates,
    out_of_order: outOfOrder, max_pause_ms: maxPauseMs,
    max_partition_pause_ms: maxPartitionPauseMs, messages,
    stream_ended: streamEnded, produce_errors: produceErrors,
  });
  call.cancel();
  setTimeout(() => process.exit(0), 50);
});

const producer = produce();
