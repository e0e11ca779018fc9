//! Who owns `v1beta1.external.metrics.k8s.io`, and patching its `caBundle` when it is Sluice's.

use k8s_openapi::{ByteString, kube_aggregator::pkg::apis::apiregistration::v1::APIService};
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use serde_json::json;

/// Name of the APIService of the external metrics API.
pub const APISERVICE_NAME: &str = "v1beta1.external.metrics.k8s.io";

/// Who serves the external metrics API.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Owner {
    /// Sluice: the APIService's service is in the operator's namespace.
    Sluice,
    /// Someone else (KEDA, prometheus-adapter, Datadog); the text names their service.
    Other(String),
    /// No APIService: nobody serves the API, so an HPA on an External metric cannot work.
    Absent,
}

/// Decides ownership from the APIService (if any) and the operator's namespace. Pure.
pub fn owner_of(api: Option<&APIService>, our_namespace: &str) -> Owner {
    let Some(api) = api else {
        return Owner::Absent;
    };
    match api.spec.as_ref().and_then(|s| s.service.as_ref()) {
        Some(svc) if svc.namespace.as_deref() == Some(our_namespace) => Owner::Sluice,
        Some(svc) => Owner::Other(format!(
            "service {}/{}",
            svc.namespace.as_deref().unwrap_or("?"),
            svc.name.as_deref().unwrap_or("?")
        )),
        None => Owner::Other("a local (in-process) API".into()),
    }
}

/// Reads the APIService and decides its owner.
pub async fn owner(client: &Client, our_namespace: &str) -> kube::Result<Owner> {
    let api: Api<APIService> = Api::all(client.clone());
    Ok(owner_of(
        api.get_opt(APISERVICE_NAME).await?.as_ref(),
        our_namespace,
    ))
}

/// Sets the APIService's `caBundle` to `ca_pem` when Sluice owns it; returns whether it did.
pub async fn patch_ca_bundle(client: &Client, our_namespace: &str, ca_pem: &str) -> kube::Result<bool> {
    let api: Api<APIService> = Api::all(client.clone());
    let current = api.get_opt(APISERVICE_NAME).await?;
    if owner_of(current.as_ref(), our_namespace) != Owner::Sluice {
        return Ok(false);
    }
    let bundle = ByteString(ca_pem.as_bytes().to_vec());
    if current.and_then(|a| a.spec).and_then(|s| s.ca_bundle) == Some(bundle.clone()) {
        return Ok(true);
    }
    api.patch(
        APISERVICE_NAME,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"caBundle": bundle, "insecureSkipTLSVerify": false}})),
    )
    .await?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apiservice(ns: &str, name: &str) -> APIService {
        serde_json::from_value(json!({
            "metadata": {"name": APISERVICE_NAME},
            "spec": {"group": "external.metrics.k8s.io", "version": "v1beta1", "groupPriorityMinimum": 100,
                     "versionPriority": 100, "service": {"namespace": ns, "name": name}},
        }))
        .unwrap()
    }

    #[test]
    fn the_api_is_ours_only_when_its_service_is_in_our_namespace() {
        assert_eq!(
            owner_of(
                Some(&apiservice("sluice-system", "sluice-metrics-api")),
                "sluice-system"
            ),
            Owner::Sluice
        );
        assert_eq!(
            owner_of(
                Some(&apiservice("keda", "keda-operator-metrics-apiserver")),
                "sluice-system"
            ),
            Owner::Other("service keda/keda-operator-metrics-apiserver".into())
        );
        assert_eq!(owner_of(None, "sluice-system"), Owner::Absent);
    }
}
