// One member of a consumer group, as a Node.js service would be: a Subscribe stream with a
// group_id (the node joins the group for the stream and leaves when it ends) and, with
// --commit, a CommitOffsets after every message it has processed (at-least-once).
//
// Prints JSON lines: {"event":"assignment",...} on every assignment, {"event":"records",
// "partition":p,"first":o,"last":o,"count":n} per message, {"event":"committed","partition":p,
// "offset":o} per confirmed commit, {"event":"end",...} when the stream ends. Reads commands
// from stdin: "exit" ends the stream and the process.
'use strict';

const {
  recordClient, unary, emit, onCommand, args, sleep, RETRIABLE,
} = require('./lib/strom');

const a = args();
const client = recordClient(a.address);
let subscriptionId = null;
let ending = false;

const call = client.Subscribe({
  group_id: a.group,
  topics: String(a.topic).split(','),
  start: a.latest ? 'START_POSITION_LATEST' : 'START_POSITION_EARLIEST',
  auto_commit: Boolean(a['auto-commit']),
  max_records_per_message: Number(a['max-records'] || 0),
});

// Commits go one at a time per member here (the node would also drop one that overtook a
// newer one); a retriable error is retried after a backoff, as docs/grpc-clients.md says.
let commitChain = Promise.resolve();
function commit(topic, partition, offset) {
  commitChain = commitChain.then(async () => {
    for (let attempt = 1; attempt <= 200 && !ending; attempt++) {
      let resp;
      try {
        resp = await unary(client, 'CommitOffsets', {
          subscription_id: subscriptionId,
          offsets: [{ topic, partition, offset }],
        });
      } catch (err) {
        emit({ event: 'commit_error', partition, offset, error: String(err.details || err) });
        await sleep(100);
        continue;
      }
      const code = resp.error_code !== 'NONE' ? resp.error_code : resp.results[0].error_code;
      if (code === 'NONE') {
        emit({ event: 'committed', partition, offset });
        return;
      }
      emit({ event: 'commit_error', partition, offset, error: code });
      if (!RETRIABLE.has(code)) return; // e.g. the partition moved away: drop the commit
      await sleep(100);
    }
  });
}

call.on('data', (msg) => {
  if (msg.event === 'assignment') {
    subscriptionId = msg.assignment.subscription_id;
    const partitions = [];
    for (const tp of msg.assignment.partitions) {
      for (const p of tp.partitions) partitions.push(p);
    }
    partitions.sort((x, y) => x - y);
    emit({
      event: 'assignment', subscription: subscriptionId, member: msg.assignment.member_id,
      partitions,
    });
    return;
  }
  const r = msg.records;
  const n = r.offsets.length;
  emit({
    event: 'records', topic: r.topic, partition: r.partition, first: r.offsets[0],
    last: r.offsets[n - 1], count: n, high_watermark: r.high_watermark,
  });
  if (a.commit) commit(r.topic, r.partition, r.offsets[n - 1] + 1);
});
call.on('error', (err) => {
  if (!ending) emit({ event: 'end', code: err.code, details: err.details });
  process.exit(ending ? 0 : 2);
});
call.on('end', () => {
  emit({ event: 'end', code: 0 });
  process.exit(0);
});

onCommand(async (cmd) => {
  if (cmd === 'exit') {
    await commitChain;
    ending = true;
    call.cancel();
    setTimeout(() => process.exit(0), 100);
  }
});
