// One Subscribe stream (explicit: every partition of --topic, from --start earliest|latest),
// on a channel of its own with the options a test gives, printing what arrives:
//   {"event":"assignment","partitions":[...]}        each assignment message
//   {"event":"records","partition":p,"offsets":[...],"sizes":[...],"timestamps":[...],
//    "timestampTypes":[...]}                          each records message
//   {"event":"ended","code":c,"details":"..."}         the stream's end (then exits 0)
// Options: --keepalive-ms N (grpc.keepalive_time_ms, with a 5 s keepalive timeout) and
// --max-receive N (grpc.max_receive_message_length). The test stops it with "stop" on stdin.
'use strict';

const { api, grpc, emit, onCommand, args } = require('./lib/strom');

const a = args();
const options = {};
if (a['keepalive-ms']) {
  options['grpc.keepalive_time_ms'] = Number(a['keepalive-ms']);
  options['grpc.keepalive_timeout_ms'] = 5000;
}
if (a['max-receive']) options['grpc.max_receive_message_length'] = Number(a['max-receive']);
const client = new api.RecordService(a.address, grpc.credentials.createInsecure(), options);
const start = a.start === 'latest' ? 'START_POSITION_LATEST' : 'START_POSITION_EARLIEST';
const call = client.Subscribe({ topics: [a.topic], start });
call.on('data', (msg) => {
  if (msg.event === 'assignment') {
    const partitions = msg.assignment.partitions.flatMap((tp) => tp.partitions);
    emit({ event: 'assignment', partitions });
    return;
  }
  const { partition, offsets, records } = msg.records;
  emit({
    event: 'records',
    partition,
    offsets,
    sizes: records.values.map((v) => v.length),
    timestamps: records.timestamps,
    timestampTypes: records.timestamp_types,
  });
});
call.on('error', (err) => {
  emit({ event: 'ended', code: err.code, details: err.details });
  process.exit(0);
});
onCommand((line) => {
  if (line === 'stop') {
    call.cancel();
    process.exit(0);
  }
});
