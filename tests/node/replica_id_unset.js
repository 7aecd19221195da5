// StorageService.ListOffsets and Fetch as a Node.js caller writes them: replica_id left unset
// (proto3 sends 0, which is also a node id). The node must read such calls as a consumer's
// (storage.proto, FetchRequest.replica_id): "latest" bounded by the high watermark (or the
// last stable offset under read_committed), reads stopped there too.
// --address, --topic; partition 0. Prints one JSON line:
// {"event":"result","latest":{"committed":n,"uncommitted":n},
//  "fetch":{"committed":{...},"uncommitted":{...}}}, each fetch answer as
// {error_code, high_watermark, last_stable_offset, end}: end = the offset after the last
// record returned (0 when none).
'use strict';

const { storageClient, unary, emit, args } = require('./lib/strom');

const a = args();
const client = storageClient(a.address);
const COMMITTED = 'ISOLATION_LEVEL_READ_COMMITTED';
const UNCOMMITTED = 'ISOLATION_LEVEL_READ_UNCOMMITTED';

async function latest(isolation) {
  // No replica_id: what a caller that has not read the field's comment sends.
  const resp = await unary(client, 'ListOffsets', {
    isolation_level: isolation,
    topics: [{ topic: a.topic, partitions: [{ partition: 0, current_leader_epoch: -1, timestamp: -1 }] }],
  });
  const p = resp.topics[0].partitions[0];
  if (p.error_code !== 'NONE') throw new Error(`ListOffsets: ${p.error_code} ${p.error_message}`);
  return p.offset;
}

// The offset after the last record of the batches in `records` (each batch: base_offset int64
// at byte 0, batch_length int32 at 8 counting the bytes after it, last_offset_delta int32 at 23).
function endOf(records) {
  let end = 0;
  for (let pos = 0; pos + 27 <= records.length; pos += 12 + records.readInt32BE(pos + 8)) {
    end = Number(records.readBigInt64BE(pos)) + records.readInt32BE(pos + 23) + 1;
  }
  return end;
}

async function fetch(isolation) {
  const resp = await unary(client, 'Fetch', {
    max_wait_ms: 0,
    max_bytes: 1 << 20,
    isolation_level: isolation,
    topics: [
      {
        topic: a.topic,
        partitions: [
          {
            partition: 0,
            fetch_offset: 0,
            current_leader_epoch: -1,
            last_fetched_epoch: -1,
            log_start_offset: -1,
            partition_max_bytes: 1 << 20,
          },
        ],
      },
    ],
  });
  const p = resp.topics[0].partitions[0];
  return {
    error_code: p.error_code,
    error_message: p.error_message,
    high_watermark: p.high_watermark,
    last_stable_offset: p.last_stable_offset,
    end: endOf(p.records),
  };
}

(async () => {
  const out = { event: 'result' };
  out.latest = { committed: await latest(COMMITTED), uncommitted: await latest(UNCOMMITTED) };
  out.fetch = { committed: await fetch(COMMITTED), uncommitted: await fetch(UNCOMMITTED) };
  emit(out);
})()
  .catch((err) => {
    emit({ event: 'result', error: err.message });
  })
  .finally(() => client.close());
