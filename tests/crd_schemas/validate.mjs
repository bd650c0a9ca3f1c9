// Validate custom-resource objects against their CRD schemas: the Prometheus Operator's
// (PodMonitor, PrometheusRule) and KEDA's (ScaledObject).
// stdin: a JSON list of objects; stdout: a JSON list of [kind, name, error or null].
import { readFileSync } from "node:fs";
import * as keda from "@kubernetes-models/keda/keda.sh/v1alpha1";
import * as monitoring from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1";

const GROUPS = { "monitoring.coreos.com/v1": monitoring, "keda.sh/v1alpha1": keda };

const docs = JSON.parse(readFileSync(0, "utf8"));
const out = docs.map((doc) => {
  const Model = GROUPS[doc.apiVersion]?.[doc.kind];
  if (!Model) {
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
