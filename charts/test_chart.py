"""Checks of the Sluice Helm chart with the real Helm SDK (helm-python-sdk) and the Kubernetes schemas of
the oldest and newest Kubernetes versions Sluice supports (kubernetes-validate).

Run: python3 charts/test_chart.py   (make test runs it; .ci/deps.sh installs the two packages)
"""

import copy
import json
import pathlib
import sys
import unittest

import helm_python
import kubernetes_validate
import yaml

CHART = pathlib.Path(__file__).resolve().parent / "sluice"
REPO = CHART.parent.parent
# The versions the README claims: 1.33 is the oldest (native sidecars, webhook matchConditions GA).
KUBE_VERSIONS = ["1.33.0", "1.37.0"]
# Kinds that belong to other projects' CRDs, absent from the Kubernetes schemas.
FOREIGN_KINDS = {"ServiceMonitor", "Certificate", "Issuer"}
STANDARD_LABELS = [
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
    "helm.sh/chart",
]

# One values override per option the chart offers; each must render and validate.
OPTIONS = {
    "cert-manager with its own self-signed issuer": {"webhook": {"certManager": {"enabled": True}}},
    "cert-manager with a cluster issuer": {
        "webhook": {"certManager": {"enabled": True, "issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"}}}
    },
    "external metrics off (KEDA owns the APIService)": {"externalMetrics": {"enabled": False}},
    "service monitor": {"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}}},
    "secrets in listed namespaces": {"rbac": {"secretNamespaces": ["shop", "billing"]}},
    "secrets cluster-wide": {"rbac": {"secretsClusterWide": True}},
    "plain-container sidecar": {"sidecar": {"native": False}},
    "single replica without PDB": {"replicaCount": 1, "podDisruptionBudget": {"enabled": False}},
    "no topology spread": {"topologySpreadConstraints": []},
    "existing service account": {"serviceAccount": {"create": False, "name": "ops-sluice"}},
    "scheduling knobs": {
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ops", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {}},
        "priorityClassName": "system-cluster-critical",
        "imagePullSecrets": [{"name": "regcred"}],
        "podAnnotations": {"a": "b"},
        "podLabels": {"team": "platform"},
    },
    "JobQueue access check off": {"webhook": {"jobQueueAccessCheck": False}},
    "watched namespaces": {"watchNamespaces": ["shop", "billing"]},
    "queue API reviewers in listed namespaces": {"queueApi": {"reviewerNamespaces": ["shop"]}},
    "queue API auth off": {"queueApi": {"auth": "off"}},
    "pinned images": {"image": {"tag": "0.1.0"}, "sidecar": {"image": {"repository": "r/s", "tag": "x"}}},
}

# Values the schema must refuse, with a fragment of the error naming the field.
BAD_VALUES = {
    "zero replicas": ({"replicaCount": 0}, "replicaCount"),
    "unknown pull policy": ({"image": {"pullPolicy": "Sometimes"}}, "pullPolicy"),
    "misspelled top-level key": ({"replicas": 2}, "replicas"),
    "port out of range": ({"webhook": {"port": 70000}}, "port"),
    "namespace that is not a DNS label": ({"rbac": {"secretNamespaces": ["Bad_NS"]}}, "secretNamespaces"),
    "watched namespace that is not a DNS label": ({"watchNamespaces": ["Bad_NS"]}, "watchNamespaces"),
    "unknown log format": ({"logFormat": "xml"}, "logFormat"),
    "unknown queue API auth mode": ({"queueApi": {"auth": "token"}}, "auth"),
    "resource quantity that is not one": ({"resources": {"limits": {"memory": "lots"}}}, "memory"),
    "webhook timeout over the API server's cap": ({"webhook": {"timeoutSeconds": 60}}, "timeoutSeconds"),
    "issuer of an unknown kind": (
        {"webhook": {"certManager": {"enabled": True, "issuerRef": {"name": "x", "kind": "Vault"}}}},
        "kind",
    ),
}


def merge(base, override):
    out = copy.deepcopy(base)
    for k, v in override.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def env_of(docs):
    (operator,) = [d for _, d in docs if d["kind"] == "Deployment"]
    return {e["name"]: e.get("value") for e in operator["spec"]["template"]["spec"]["containers"][0]["env"]}


def render(values=None):
    chart = helm_python.Chart.load(str(CHART))
    out = chart.render(values or {}, name="sluice", namespace="sluice-system", is_install=True)
    docs = []
    for path, text in sorted(out.items()):
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                docs.append((path, doc))
    return docs, out


class ChartTest(unittest.TestCase):
    def assert_valid(self, docs, label):
        for path, doc in docs:
            kind = doc.get("kind")
            if kind in FOREIGN_KINDS:
                continue
            for version in KUBE_VERSIONS:
                try:
                    kubernetes_validate.validate(doc, version, strict=True)
                except kubernetes_validate.ValidationError as e:
                    self.fail(f"{label}: {path} {kind}/{doc['metadata'].get('name')} invalid on {version}: {e.message}")

    def test_lint_passes(self):
        result = helm_python.lint(str(CHART), strict=True)
        self.assertEqual(result["errors"], [], result)
        errors = [m for m in result["messages"] if m["severity"] > 1 and "icon" not in m["error"]]
        self.assertEqual(errors, [], result)

    def test_defaults_render_and_validate_on_oldest_and_newest_kubernetes(self):
        docs, out = render()
        kinds = sorted({d["kind"] for _, d in docs})
        for expected in ["Deployment", "MutatingWebhookConfiguration", "APIService", "PodDisruptionBudget",
                         "ServiceAccount", "ClusterRole", "Role", "Service"]:
            self.assertIn(expected, kinds)
        self.assert_valid(docs, "defaults")
        self.assertIn("sluice.dev/inject", out["sluice/templates/NOTES.txt"])

    def test_every_option_renders_and_validates(self):
        for label, override in OPTIONS.items():
            with self.subTest(option=label):
                docs, _ = render(override)
                self.assert_valid(docs, label)

    def test_every_object_carries_the_standard_labels(self):
        docs, _ = render(merge(OPTIONS["service monitor"], OPTIONS["cert-manager with its own self-signed issuer"]))
        for path, doc in docs:
            labels = doc["metadata"].get("labels", {})
            for label in STANDARD_LABELS:
                self.assertIn(label, labels, f"{path} {doc['kind']} lacks {label}")

    def test_webhook_fails_closed_but_only_for_pods_that_ask(self):
        docs, _ = render()
        (hook,) = [d for _, d in docs if d["kind"] == "MutatingWebhookConfiguration"]
        w = hook["webhooks"][0]
        self.assertEqual(w["failurePolicy"], "Fail")
        self.assertTrue(w["matchConditions"], "an unscoped Fail webhook can block a whole cluster")
        excluded = w["namespaceSelector"]["matchExpressions"][0]["values"]
        self.assertIn("sluice-system", excluded, "the operator's own namespace must never be injected")

    def test_job_queues_are_checked_by_a_validating_webhook_on_create_and_update(self):
        docs, _ = render()
        (hook,) = [d for _, d in docs if d["kind"] == "ValidatingWebhookConfiguration"]
        (mutating,) = [d for _, d in docs if d["kind"] == "MutatingWebhookConfiguration"]
        # One name for both: the operator patches the caBundle of each by that name.
        self.assertEqual(hook["metadata"]["name"], mutating["metadata"]["name"])
        (w,) = hook["webhooks"]
        self.assertEqual(w["failurePolicy"], "Fail")
        self.assertEqual(w["clientConfig"]["service"]["path"], "/validate-jobqueue")
        (rule,) = w["rules"]
        self.assertEqual((rule["apiGroups"], rule["resources"], sorted(rule["operations"])),
                         (["sluice.dev"], ["jobqueues"], ["CREATE", "UPDATE"]))
        (role,) = [d for _, d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "sluice"]
        patchable = [r for r in role["rules"] if "validatingwebhookconfigurations" in r["resources"]]
        self.assertEqual(patchable[0]["resourceNames"], [hook["metadata"]["name"]])
        docs, _ = render(OPTIONS["JobQueue access check off"])
        self.assertFalse([d for _, d in docs if d["kind"] == "ValidatingWebhookConfiguration"])

    def test_the_operator_may_write_network_policies_and_list_services(self):
        docs, _ = render()
        (role,) = [d for _, d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "sluice"]
        def verbs(group, resource):
            return {v for r in role["rules"] if group in r["apiGroups"] and resource in r["resources"]
                    and not r.get("resourceNames") for v in r["verbs"]}
        self.assertLessEqual({"get", "list", "watch", "create", "patch", "delete"},
                             verbs("networking.k8s.io", "networkpolicies"))
        self.assertIn("list", verbs("", "services"))

    def test_watched_namespaces_get_roles_and_the_cluster_role_writes_nothing_namespaced(self):
        docs, _ = render(OPTIONS["watched namespaces"])
        (role,) = [d for _, d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "sluice"]
        namespaced = {"deployments", "configmaps", "horizontalpodautoscalers", "pods", "networkpolicies",
                      "scaledobjects", "ratelimitpolicies", "jobqueues", "services", "events"}
        for rule in role["rules"]:
            self.assertFalse(namespaced & set(rule["resources"]), f"cluster-wide rule on {rule['resources']}")
        roles = {d["metadata"]["namespace"]: d for _, d in docs
                 if d["kind"] == "Role" and d["metadata"]["name"] == "sluice-watch"}
        for ns in ["shop", "billing"]:
            self.assertIn(ns, roles)
            granted = {r for rule in roles[ns]["rules"] for r in rule["resources"]}
            self.assertLessEqual({"deployments", "configmaps", "networkpolicies", "ratelimitpolicies"}, granted)
        bound = {(d["metadata"]["namespace"], d["roleRef"]["name"]) for _, d in docs if d["kind"] == "RoleBinding"}
        self.assertLessEqual({("shop", "sluice-watch"), ("billing", "sluice-watch")}, bound)
        (operator,) = [d for _, d in docs if d["kind"] == "Deployment"]
        env = {e["name"]: e.get("value") for e in operator["spec"]["template"]["spec"]["containers"][0]["env"]}
        self.assertEqual(env["SLUICE_WATCH_NAMESPACES"], "shop,billing")
        (hook,) = [d for _, d in docs if d["kind"] == "MutatingWebhookConfiguration"]
        exprs = hook["webhooks"][0]["namespaceSelector"]["matchExpressions"]
        self.assertIn({"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["shop", "billing"]}, exprs)
        # Without the list: one ClusterRole with everything, no per-namespace Role.
        docs, _ = render()
        self.assertFalse([d for _, d in docs if d["kind"] == "Role" and d["metadata"]["name"] == "sluice-watch"])

    def test_the_metrics_api_delegates_authentication_and_authorization_to_the_api_server(self):
        docs, _ = render()
        bindings = {(d["kind"], d["metadata"].get("namespace"), d["roleRef"]["name"])
                    for _, d in docs if d["kind"] in ("ClusterRoleBinding", "RoleBinding")}
        # TokenReview and SubjectAccessReview, and reading the front-proxy CA in kube-system.
        self.assertIn(("ClusterRoleBinding", None, "system:auth-delegator"), bindings)
        self.assertIn(("RoleBinding", "kube-system", "extension-apiserver-authentication-reader"), bindings)
        (operator,) = [d for _, d in docs if d["kind"] == "Deployment"]
        env = {e["name"]: e.get("value") for e in operator["spec"]["template"]["spec"]["containers"][0]["env"]}
        (api,) = [d for _, d in docs if d["kind"] == "APIService"]
        # The serving certificate is issued for the Service the APIService names.
        self.assertEqual(env["SLUICE_EXTERNAL_METRICS_SERVICE"], api["spec"]["service"]["name"])
        # With the API off, none of it is rendered.
        docs, _ = render(OPTIONS["external metrics off (KEDA owns the APIService)"])
        roles = {d["roleRef"]["name"] for _, d in docs if d["kind"] in ("ClusterRoleBinding", "RoleBinding")}
        self.assertNotIn("system:auth-delegator", roles)

    def test_injected_sidecars_may_review_queue_api_callers_and_nothing_else(self):
        def reviewers(values):
            docs, _ = render(values)
            (operator,) = [d for _, d in docs if d["kind"] == "Deployment"]
            env = {e["name"]: e.get("value") for e in operator["spec"]["template"]["spec"]["containers"][0]["env"]}
            roles = [d for _, d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "sluice-queue-api-reviewer"]
            bindings = [d for _, d in docs
                        if d["kind"] == "ClusterRoleBinding" and d["roleRef"]["name"] == "sluice-queue-api-reviewer"]
            return env["SLUICE_QUEUE_API_AUTH"], roles, bindings

        auth, (role,), (binding,) = reviewers({})
        self.assertEqual(auth, "kubernetes", "on by default")
        self.assertEqual(
            sorted((r["apiGroups"], r["resources"], r["verbs"]) for r in role["rules"]),
            [(["authentication.k8s.io"], ["tokenreviews"], ["create"]),
             (["authorization.k8s.io"], ["subjectaccessreviews"], ["create"])],
        )
        self.assertEqual(binding["roleRef"]["name"], "sluice-queue-api-reviewer")
        # No namespace listed: the chart binds no one (never the group of every ServiceAccount) and names
        # the binding to the operator, which keeps its subjects to the namespaces holding JobQueues.
        # Without a `subjects` key, `helm upgrade` leaves the operator's subjects alone.
        # It has a name of its own, so switching to listed namespaces replaces it rather than conflicting
        # with the operator's field manager over the subjects.
        self.assertNotIn("subjects", binding)
        self.assertEqual(binding["metadata"]["name"], "sluice-queue-api-reviewer-jobqueues")
        self.assertEqual(env_of(render()[0])["SLUICE_QUEUE_API_REVIEWER_BINDING"], binding["metadata"]["name"])
        _, _, (binding,) = reviewers(OPTIONS["watched namespaces"])
        self.assertEqual([s["name"] for s in binding["subjects"]],
                         ["system:serviceaccounts:shop", "system:serviceaccounts:billing"])
        _, _, (binding,) = reviewers(OPTIONS["queue API reviewers in listed namespaces"])
        self.assertEqual([s["name"] for s in binding["subjects"]], ["system:serviceaccounts:shop"])
        for listed in ("watched namespaces", "queue API reviewers in listed namespaces", "queue API auth off"):
            self.assertNotIn("SLUICE_QUEUE_API_REVIEWER_BINDING", env_of(render(OPTIONS[listed])[0]), listed)
        auth, roles, bindings = reviewers(OPTIONS["queue API auth off"])
        self.assertEqual((auth, roles, bindings), ("off", [], []))

    def test_the_operator_may_change_only_the_reviewers_binding_and_bind_only_its_role(self):
        def rbac_rules(values):
            docs, _ = render(values)
            (role,) = [d for _, d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "sluice"]
            return [r for r in role["rules"] if "rbac.authorization.k8s.io" in r["apiGroups"]]

        self.assertEqual(
            sorted((r["resources"], r.get("resourceNames"), r["verbs"]) for r in rbac_rules({})),
            [(["clusterrolebindings"], ["sluice-queue-api-reviewer-jobqueues"], ["get", "patch", "update"]),
             (["clusterroles"], ["sluice-queue-api-reviewer"], ["bind"])],
        )
        for listed in ("watched namespaces", "queue API reviewers in listed namespaces", "queue API auth off"):
            self.assertEqual(rbac_rules(OPTIONS[listed]), [], listed)

    def test_no_cluster_wide_secret_access_by_default(self):
        docs, _ = render()
        for _, doc in docs:
            if doc["kind"] == "ClusterRole":
                for rule in doc["rules"]:
                    self.assertNotIn("secrets", rule.get("resources", []), f"{doc['metadata']['name']} reads Secrets")

    def test_secret_access_is_per_listed_namespace_without_watch(self):
        docs, _ = render(OPTIONS["secrets in listed namespaces"])
        roles = {d["metadata"]["namespace"]: d for _, d in docs
                 if d["kind"] == "Role" and d["metadata"]["name"] == "sluice-secrets"}
        self.assertEqual(sorted(roles), ["billing", "shop"])
        for role in roles.values():
            # delete: tenant Secrets of a namespace a QueueDatabase no longer admits.
            self.assertEqual([(r["resources"], r["verbs"]) for r in role["rules"]],
                             [(["secrets"], ["get", "list", "create", "update", "patch", "delete"])])

    def test_queue_databases_are_patched_only_for_their_finalizer_and_status(self):
        docs, _ = render()
        cluster = next(d for _, d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "sluice")
        verbs = {r["resources"][0]: r["verbs"] for r in cluster["rules"]
                 if r.get("apiGroups") in (["sluice.dev"], [""]) and r["resources"][0] in
                 ("queuedatabases", "queuedatabases/status", "namespaces")}
        self.assertEqual(verbs, {"queuedatabases": ["get", "list", "watch", "patch"],
                                 "queuedatabases/status": ["get", "patch"],
                                 "namespaces": ["get", "list", "watch"]})
        release = next(d for _, d in docs if d["kind"] == "Role" and d["metadata"]["name"] == "sluice")
        unnamed = [r["verbs"] for r in release["rules"]
                   if r.get("resources") == ["secrets"] and "resourceNames" not in r]
        self.assertEqual(sorted(unnamed), [["create"], ["get"]], "Secrets in the release namespace: no list or watch")

    def test_containers_run_as_non_root_with_a_read_only_root(self):
        docs, _ = render()
        pods = [d["spec"]["template"]["spec"] for _, d in docs if d["kind"] == "Deployment"]
        pods += [d["spec"] for _, d in docs if d["kind"] == "Pod"]
        for spec in pods:
            self.assertTrue(spec["securityContext"]["runAsNonRoot"])
            for c in spec["containers"]:
                self.assertFalse(c["securityContext"]["allowPrivilegeEscalation"])
                self.assertTrue(c["securityContext"]["readOnlyRootFilesystem"])
                self.assertEqual(c["securityContext"]["capabilities"]["drop"], ["ALL"])

    def test_bad_values_are_rejected_by_the_schema_naming_the_field(self):
        for label, (values, field) in BAD_VALUES.items():
            with self.subTest(bad=label):
                chart = helm_python.Chart.load(str(CHART))
                with self.assertRaises(helm_python.HelmError) as ctx:
                    chart.render(values, name="sluice", namespace="sluice-system", is_install=True)
                self.assertIn(field, str(ctx.exception))

    def test_chart_crds_are_the_generated_crds(self):
        generated = sorted(p.name for p in (REPO / "crds").glob("*.yaml"))
        in_chart = sorted(p.name for p in (CHART / "crds").glob("*.yaml"))
        self.assertEqual(in_chart, generated, "charts/sluice/crds must hold exactly the generated crds/*.yaml (run `make crds`)")
        for name in generated:
            self.assertEqual((CHART / "crds" / name).read_text(), (REPO / "crds" / name).read_text(),
                             f"charts/sluice/crds/{name} is stale: run `make crds`")


if __name__ == "__main__":
    result = unittest.main(exit=False, verbosity=1).result
    failed = len(result.failures) + len(result.errors)
    print(f"{result.testsRun - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)
