// KafkaJS against Shoal, driven by test_kafkajs.py: argv[2] is a JSON object
// {connection, steps}; each step runs in order and prints one JSON line
// {step, ...result} on stdout. KafkaJS's own log goes to stderr.
//
// connection: {brokers: [...], username?, password?, mechanism?}; with a username,
// SASL over plain TCP (ssl false), as a tenant logs in to the gateway: PLAIN
// unless mechanism says 'scram-sha-256' or 'scram-sha-512'.
'use strict';

const { ConfigResourceTypes, Kafka, logLevel } = require('kafkajs');

const spec = JSON.parse(process.argv[2]);

function client() {
  const { brokers, username, password, mechanism } = spec.connection;
  const config = {
    clientId: 'shoal-kafkajs-test',
    brokers,
    ssl: false,
    connectionTimeout: 10000,
    requestTimeout: 30000,
    logLevel: logLevel.WARN,
    logCreator: () => ({ namespace, level, log }) => {
      const { message, ...extra } = log;
      process.stderr.write(`[kafkajs ${level} ${namespace}] ${message} ${JSON.stringify(extra)}\n`);
    },
  };
  if (username !== undefined) {
    config.sasl = { mechanism: mechanism || 'plain', username, password };
  }
  return new Kafka(config);
}

const kafka = client();

function emit(step, result) {
  process.stdout.write(JSON.stringify({ step, ...result }) + '\n');
}

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

// {transactionalId, topic, partitions, transactions: [{values, commit}]}: one
// transactional producer, each transaction sent record by record to partition
// i % partitions, then committed or aborted.
async function transactions(step) {
  const producer = kafka.producer({
    transactionalId: step.transactionalId,
    idempotent: true,
    maxInFlightRequests: 1,
  });
  await producer.connect();
  try {
    const outcomes = [];
    for (const { values, commit } of step.transactions) {
      const transaction = await producer.transaction();
      try {
        await transaction.send({
          topic: step.topic,
          messages: values.map((value, i) => ({ value, partition: i % step.partitions })),
        });
      } catch (error) {
        await transaction.abort();
        throw error;
      }
      if (commit) {
        await transaction.commit();
      } else {
        await transaction.abort();
      }
      outcomes.push(commit ? 'committed' : 'aborted');
    }
    return { outcomes };
  } finally {
    await producer.disconnect();
  }
}

// {topic, readUncommitted, expected, settleMs, timeoutMs}: a consumer of a new
// group reads the topic from the beginning until `expected` records came, then
// settleMs more to catch any extra one.
async function consume(step) {
  const consumer = kafka.consumer({
    groupId: `kafkajs-read-${process.pid}-${Date.now()}`,
    readUncommitted: step.readUncommitted,
    maxWaitTimeInMs: 200,
  });
  await consumer.connect();
  const records = [];
  try {
    await consumer.subscribe({ topic: step.topic, fromBeginning: true });
    await consumer.run({
      autoCommit: false,
      eachMessage: async ({ partition, message }) => {
        records.push({ value: message.value.toString(), partition, offset: message.offset });
      },
    });
    const deadline = Date.now() + step.timeoutMs;
    while (records.length < step.expected && Date.now() < deadline) {
      await sleep(100);
    }
    await sleep(step.settleMs);
  } finally {
    await consumer.disconnect();
  }
  return { records };
}

// {topic, values}: a plain (non-transactional) producer sends the values, acks=all.
async function produce(step) {
  const producer = kafka.producer();
  await producer.connect();
  try {
    const sent = await producer.send({
      topic: step.topic,
      acks: -1,
      messages: step.values.map((value) => ({ value })),
    });
    return { sent: sent.map(({ partition, baseOffset }) => ({ partition, baseOffset })) };
  } finally {
    await producer.disconnect();
  }
}

// {source, sink, groupId, transactionalId, expected, commit, timeoutMs}:
// consume-transform-produce. For each batch from `source` (group `groupId`,
// read_committed, no auto commit), one transaction sends the batch's values with
// "in-" made "out-" to the same partition of `sink`, and the batch's next offset
// with transaction.sendOffsets; then commits or aborts. Stops after `expected`
// records, and answers with the group's committed offsets as the admin client
// fetches them.
async function transform(step) {
  const producer = kafka.producer({
    transactionalId: step.transactionalId,
    idempotent: true,
    maxInFlightRequests: 1,
  });
  const consumer = kafka.consumer({ groupId: step.groupId, maxWaitTimeInMs: 200 });
  await producer.connect();
  await consumer.connect();
  let done = 0;
  try {
    await consumer.subscribe({ topic: step.source, fromBeginning: true });
    await consumer.run({
      autoCommit: false,
      eachBatchAutoResolve: false,
      eachBatch: async ({ batch, resolveOffset }) => {
        if (batch.messages.length === 0) {
          return;
        }
        const transaction = await producer.transaction();
        await transaction.send({
          topic: step.sink,
          messages: batch.messages.map((m) => ({
            value: m.value.toString().replace('in-', step.commit ? 'out-' : 'discarded-out-'),
            partition: batch.partition,
          })),
        });
        const next = (BigInt(batch.lastOffset()) + 1n).toString();
        await transaction.sendOffsets({
          consumerGroupId: step.groupId,
          topics: [{ topic: batch.topic, partitions: [{ partition: batch.partition, offset: next }] }],
        });
        if (step.commit) {
          await transaction.commit();
        } else {
          await transaction.abort();
        }
        for (const m of batch.messages) {
          resolveOffset(m.offset);
        }
        done += batch.messages.length;
      },
    });
    const deadline = Date.now() + step.timeoutMs;
    while (done < step.expected && Date.now() < deadline) {
      await sleep(100);
    }
  } finally {
    await consumer.disconnect();
    await producer.disconnect();
  }
  return { transformed: done, committed: await groupOffsets(step.groupId, step.source) };
}

async function groupOffsets(groupId, topic) {
  const admin = kafka.admin();
  await admin.connect();
  try {
    const [answer] = await admin.fetchOffsets({ groupId, topics: [topic] });
    const offsets = {};
    for (const { partition, offset } of answer.partitions) {
      offsets[partition] = Number(offset);
    }
    return offsets;
  } finally {
    await admin.disconnect();
  }
}

// {topic, partitions}: the admin client creates a topic and reads its metadata
// back, and lists the topics it can see.
async function admin(step) {
  const admin = kafka.admin();
  await admin.connect();
  try {
    const created = await admin.createTopics({
      topics: [{ topic: step.topic, numPartitions: step.partitions }],
      waitForLeaders: true,
    });
    const metadata = await admin.fetchTopicMetadata({ topics: [step.topic] });
    const listed = await admin.listTopics();
    const offsets = await admin.fetchTopicOffsets(step.topic);
    return {
      created,
      metadata: metadata.topics.map((t) => ({
        name: t.name,
        partitions: t.partitions.map((p) => ({ partition: p.partitionId, leader: p.leader })),
      })),
      listed,
      offsets: offsets.map((o) => ({ partition: o.partition, high: o.high, low: o.low })),
    };
  } finally {
    await admin.disconnect();
  }
}

// {topic}: each partition's low and high watermarks.
async function endOffsets(step) {
  const admin = kafka.admin();
  await admin.connect();
  try {
    const offsets = await admin.fetchTopicOffsets(step.topic);
    return { offsets: offsets.map((o) => ({ partition: o.partition, high: Number(o.high) })) };
  } finally {
    await admin.disconnect();
  }
}

// {create?: [acl], describe?: filter, delete?: [filter]}: KafkaJS's admin ACL calls,
// in that order; each answers with KafkaJS's result, or {error: {type, message}}.
async function acls(step) {
  const admin = kafka.admin();
  await admin.connect();
  const results = {};
  async function attempt(name, call) {
    try {
      results[name] = await call();
    } catch (error) {
      results[name] = { error: { type: error.type, message: error.message } };
    }
  }
  try {
    if (step.create) await attempt('created', () => admin.createAcls({ acl: step.create }));
    if (step.describe) await attempt('described', () => admin.describeAcls(step.describe));
    if (step.delete) await attempt('deleted', () => admin.deleteAcls({ filters: step.delete }));
    return results;
  } finally {
    await admin.disconnect();
  }
}

// {topic, alter: [{name, value}], broker}: admin.alterConfigs on the topic (the legacy
// AlterConfigs, which replaces every override), then admin.describeConfigs of the topic
// and of broker `broker` ("" for the cluster default); each answers with KafkaJS's
// result, or {error: {type, message}}.
async function configs(step) {
  const admin = kafka.admin();
  await admin.connect();
  const results = {};
  async function attempt(name, call) {
    try {
      results[name] = await call();
    } catch (error) {
      results[name] = { error: { type: error.type, message: error.message } };
    }
  }
  const topic = { type: ConfigResourceTypes.TOPIC, name: step.topic };
  try {
    await attempt('altered', () =>
      admin.alterConfigs({
        validateOnly: false,
        resources: [{ ...topic, configEntries: step.alter }],
      }),
    );
    await attempt('topic', () => admin.describeConfigs({ includeSynonyms: false, resources: [topic] }));
    await attempt('broker', () =>
      admin.describeConfigs({
        includeSynonyms: true,
        resources: [{ type: ConfigResourceTypes.BROKER, name: step.broker }],
      }),
    );
    await attempt('alteredBroker', () =>
      admin.alterConfigs({
        validateOnly: true,
        resources: [
          {
            type: ConfigResourceTypes.BROKER,
            name: step.broker,
            configEntries: [{ name: 'message.max.bytes', value: '2000000' }],
          },
        ],
      }),
    );
    return results;
  } finally {
    await admin.disconnect();
  }
}

const STEPS = { transactions, consume, produce, transform, admin, endOffsets, acls, configs };

(async () => {
  for (const step of spec.steps) {
    emit(step.kind, await STEPS[step.kind](step));
  }
})().catch((error) => {
  process.stderr.write(`${error.stack || error}\n`);
  emit('error', { name: error.name, type: error.type, message: error.message });
  process.exit(1);
});
