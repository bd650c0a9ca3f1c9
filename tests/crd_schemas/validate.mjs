// Validate Prometheus Operator objects against their CRD schemas.
// stdin: a JSON list of objects; stdout: a JSON list of [kind, name, error or null].
import { readFileSync } from "node:fs";
import * as v1 from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1";

const docs = JSON.parse(readFileSync(0, "utf8"));
const out = docs.map((doc) => {
  const Model = v1[doc.kind];
  if (doc.apiVersion !== "monitoring.coreos.com/v1" || !Model) {
    return [doc.kind, doc.metadata?.name ?? null, `no schema for ${doc.apiVersion} ${doc.kind}`];
  }
  try {
    new Model(doc).validate();
    return [doc.kind, doc.metadata?.name ?? null, null];
  } catch (e) {
    return [doc.kind, doc.metadata?.name ?? null, String(e.message)];
  }
});
process.stdout.write(JSON.stringify(out) + "\n");
