// produceRecords (lib/strom.js) while one partition cannot be written: --records keyed records
// (key "k<i>", value "v<i>", every third with a header "h" = "<i>", every fifth with a null
// key, which the node sends round-robin) in one call through the node at --address, with
// --attempts attempts. The test has killed the only replica of one partition, so that
// partition fails retriably on every attempt and the helper must resend only its records.
// Prints {"event":"result","error":message or null,"partitions":[...],"offsets":[...]}.
'use strict';

const { recordClient, produceRecords, emit, args } = require('./lib/strom');

const a = args();
const client = recordClient(a.address);
const n = Number(a.records || 60);
const keys = [];
const values = [];
const headerCounts = [];
const headerKeys = [];
const headerValues = [];
const nullKeys = [];
for (let i = 0; i < n; i++) {
  keys.push(Buffer.from(`k${i}`));
  values.push(Buffer.from(`v${i}`));
  if (i % 5 === 4) nullKeys.push(i);
  headerCounts.push(i % 3 === 0 ? 1 : 0);
  if (i % 3 === 0) {
    headerKeys.push('h');
    headerValues.push(Buffer.from(String(i)));
  }
}
const request = {
  topic: a.topic,
  timeout_ms: Number(a['timeout-ms'] || 1000),
  records: {
    keys,
    values,
    header_counts: headerCounts,
    header_keys: headerKeys,
    header_values: headerValues,
    null_keys: nullKeys,
  },
};

produceRecords(client, request, { attempts: Number(a.attempts || 5), backoffMs: 50 })
  .then((resp) => emit({ event: 'result', error: null, partitions: resp.partitions, offsets: resp.offsets }))
  .catch((err) => {
    const resp = err.response || { partitions: [], offsets: [] };
    emit({ event: 'result', error: err.message, partitions: resp.partitions, offsets: resp.offsets });
  })
  .finally(() => client.close());
