{{/*
What the operator does in the namespaces it watches: exactly the calls it
makes, so that a compromised operator can do no more. A ClusterRole when it
watches every namespace, a Role in each namespace of watchNamespaces.
*/}}
{{- define "shoal.operatorNamespacedRules" -}}
# Its own resources: kopf lists and watches them, and patches them for its
# finalizers and its progress annotations (metadata.finalizers is patched
# through the main resource, so no separate finalizers permission). kopf
# patches, never replaces (no update).
- apiGroups: [shoal.dev]
  resources: [clusters, topics, tenants]
  verbs: [list, watch, patch]
# A Topic or Tenant reads the Cluster it names.
- apiGroups: [shoal.dev]
  resources: [clusters]
  verbs: [get]
# Deleting a Tenant deletes its Topic resources, so their drift timers do not
# recreate the topics the tenant no longer owns.
- apiGroups: [shoal.dev]
  resources: [topics]
  verbs: [delete]
# Conditions, observedGeneration and health: a merge patch of the status
# subresource.
- apiGroups: [shoal.dev]
  resources: [clusters/status, topics/status, tenants/status]
  verbs: [patch]
# A Cluster's etcd and broker StatefulSets and its gateway Deployment, applied
# with server-side apply (field manager shoal-operator; a patch, and create
# when the object is new), listed by the Cluster's labels and deleted when the
# operator no longer builds them; never watched. The roller reads the broker
# StatefulSet to wait until its controller has seen an applied template.
- apiGroups: [apps]
  resources: [statefulsets, deployments]
  verbs: [list, create, patch, delete]
- apiGroups: [apps]
  resources: [statefulsets]
  verbs: [get]
# A Cluster's Services, ConfigMap and brokers' ServiceAccount; a Tenant's
# key Secrets (applied, and deleted when a key is removed from the Tenant).
- apiGroups: [""]
  resources: [services, configmaps, serviceaccounts, secrets]
  verbs: [list, create, patch, delete]
# The roller deletes one broker pod at a time (the broker StatefulSet is
# OnDelete) and reads it until it is back with the new template.
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, delete]
# A PodDisruptionBudget per etcd, broker and gateway set.
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [list, create, patch, delete]
# NetworkPolicies keep the brokers' internal listener and etcd away from
# tenants' pods.
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [list, create, patch, delete]
# kopf posts a handler's warnings and errors (a handler that failed, and why)
# as Events on the resource, which `kubectl describe` shows; it only creates them.
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- end -}}

{{/* What the operator reads outside any namespace. */}}
{{- define "shoal.operatorClusterRules" -}}
# kopf finds the resources it serves, and notices CRDs being installed or
# removed, by listing and watching the CRDs.
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [list, watch]
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
{{- if gt (int .Values.operator.replicas) 1 }}
# Replicas in kopf's peering list and watch the peering object and patch
# their own record into its status.
- apiGroups: [kopf.dev]
  resources: [clusterkopfpeerings]
  verbs: [list, watch, patch]
{{- end }}
{{- end -}}
