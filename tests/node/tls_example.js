// Connecting to a strom cluster that serves TLS and requires client certificates (mTLS, as
// `strom dev up --tls` does) from Node.js: one ProduceRecords with a client certificate.
// docs/grpc-clients.md ("TLS and mTLS") shows its core; tests/integration/test_security.py
// runs it.
//
//   npm install @grpc/grpc-js @grpc/proto-loader
//   strom dev cert alice --dir /tmp/strom-secure      # User:CN=alice, from the dev CA
//   node tls_example.js 127.0.0.1:9092 /path/to/strom/protos orders \
//     /tmp/strom-secure/tls/strom-dev-ca.crt /tmp/strom-secure/tls/alice.crt \
//     /tmp/strom-secure/tls/alice.key
'use strict';

const fs = require('fs');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const [address, protoDir, topic, caFile, certFile, keyFile] = process.argv.slice(2);

const definition = protoLoader.loadSync('strom/v1/records.proto', {
  includeDirs: [protoDir],
  keepCase: true,
  longs: Number,
  enums: String,
  defaults: true,
  oneofs: true,
});
const strom = grpc.loadPackageDefinition(definition).strom.v1;

// The CA that signed the nodes' certificates, then this client's key and certificate: its
// subject is the caller's principal (User:CN=alice), which the ACLs and quotas name. With
// TLS but no client certificates (bearer tokens instead), pass the CA alone and send
// `authorization: Bearer <token>` as call metadata.
const ca = fs.readFileSync(caFile);
const credentials = certFile
  ? grpc.credentials.createSsl(ca, fs.readFileSync(keyFile), fs.readFileSync(certFile))
  : grpc.credentials.createSsl(ca);
const client = new strom.RecordService(address, credentials, {
  'grpc.keepalive_time_ms': 10000,
  'grpc.keepalive_timeout_ms': 5000,
});

const request = { topic, records: { values: [Buffer.from('hello over mTLS')] } };
client.ProduceRecords(request, { deadline: Date.now() + 30000 }, (err, resp) => {
  client.close();
  if (err) {
    // A handshake the node refuses (no client certificate, one from another CA, an expired
    // one) and plaintext against TLS end as UNAVAILABLE "No connection established", the
    // same as a node that is down: grpc-js does not say that TLS failed.
    console.error(`${grpc.status[err.code]}: ${err.details}`);
    if (err.code === grpc.status.UNAVAILABLE) {
      console.error('(if the node is up, check the TLS settings: docs/grpc-clients.md, TLS)');
    }
    process.exit(1);
  }
  if (resp.error_code !== 'NONE') {
    console.error(`${resp.error_code}: ${resp.error_message}`);
    process.exit(1);
  }
  console.log(`produced to ${topic} ${resp.partitions[0]}@${resp.offsets[0]}`);
});
