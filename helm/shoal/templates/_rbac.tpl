{{/*
What the operator does in the namespaces it watches: exactly the calls it
makes, so that a compromised operator can do no more. A ClusterRole when it
watches every namespace, a Role in each namespace of watchNamespaces.
*/}}
{{- define "shoal.operatorNamespacedRules" -}}
# Its own resources: kopf lists and watches them, and patches them for its
# finalizers and its progress annotations (metadata.finalizers is patched
# through the main resource, so no separate finalizers permission).
- apiGroups: [shoal.dev]
  resources: [clusters, topics, tenants]
  verbs: [get, list, watch, patch, update]
# Deleting a Tenant deletes its Topic resources, so their drift timers do not
# recreate the topics the tenant no longer owns.
- apiGroups: [shoal.dev]
  resources: [topics]
  verbs: [delete]
# Conditions, observedGeneration and health go through the status subresource.
- apiGroups: [shoal.dev]
  resources: [clusters/status, topics/status, tenants/status]
  verbs: [get, patch, update]
# A Cluster's etcd and broker StatefulSets and its gateway Deployment, applied
# with server-side apply (field manager shoal-operator) and deleted when the
# operator no longer builds them.
- apiGroups: [apps]
  resources: [statefulsets, deployments]
  verbs: [get, list, watch, create, patch, delete]
# A Cluster's Services, ConfigMap and brokers' ServiceAccount; a Tenant's
# key Secrets (created, and deleted when a key is removed from the Tenant).
- apiGroups: [""]
  resources: [services, configmaps, serviceaccounts, secrets]
  verbs: [get, list, watch, create, patch, delete]
# The roller deletes one broker pod at a time (the broker StatefulSet is
# OnDelete) and watches it come back with the new template.
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, delete]
# A PodDisruptionBudget per etcd, broker and gateway set.
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, list, watch, create, patch, delete]
# NetworkPolicies keep the brokers' internal listener and etcd away from
# tenants' pods.
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, list, watch, create, patch, delete]
# kopf posts an Event on the resource for each handler's outcome.
- apiGroups: [""]
  resources: [events]
  verbs: [create, patch]
{{- end -}}

{{/* What the operator reads outside any namespace. */}}
{{- define "shoal.operatorClusterRules" -}}
# kopf finds the resources it serves, and notices CRDs being installed or
# removed, by watching the CRDs.
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [get, list, watch]
# A broker's rack (broker.rack) is its Node's value of spec.brokers.rackLabel,
# which the brokers' init container reads. The operator binds each such
# Cluster's brokers to the ClusterRole shoal-broker-node-reader (cluster-scoped,
# so deleted by the operator with the Cluster); Kubernetes lets it grant only
# what it holds itself, hence get nodes here too.
- apiGroups: [rbac.authorization.k8s.io]
  resources: [clusterrolebindings]
  verbs: [get, create, patch, delete]
- apiGroups: [""]
  resources: [nodes]
  verbs: [get]
{{- if not .Values.watchNamespaces }}
# Watching every namespace, kopf follows namespaces coming and going.
- apiGroups: [""]
  resources: [namespaces]
  verbs: [get, list, watch]
{{- end }}
{{- end -}}
