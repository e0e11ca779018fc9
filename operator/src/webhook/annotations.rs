//! The `sluice.dev/*` pod annotations that ask for injection and tune it, parsed strictly: a bad value
//! is an error naming the annotation, so a pod is rejected rather than injected half-way.
//!
//! The names are the contract's (`sluice_crds::contract::annotation`): `sluice.dev/inject`, `policy`,
//! `app-port` (absent: the port named `http`, else the pod's only container port), `listen-port`,
//! `native-sidecar` (absent: the operator's `--sidecar-native`) and `job-queues` (asks for injection by
//! itself unless `sluice.dev/inject: "false"`; with no RateLimitPolicy for the pod, the sidecar only
//! serves the queue API).

use std::collections::BTreeMap;

use sluice_crds::names::{is_dns_label, is_dns_subdomain};

pub use sluice_crds::contract::annotation::{
    APP_PORT, INJECT, JOB_QUEUES, LISTEN_PORT, NATIVE_SIDECAR, POLICY,
};

/// A port as an annotation names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PortRef {
    /// A container port's `name`.
    Name(String),
    /// A container port number.
    Number(u16),
}

/// What a pod's annotations ask for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InjectAnnotations {
    /// Whether injection is asked for.
    pub inject: bool,
    /// `sluice.dev/policy`.
    pub policy: Option<String>,
    /// `sluice.dev/app-port`.
    pub app_port: Option<PortRef>,
    /// `sluice.dev/listen-port`.
    pub listen_port: Option<u16>,
    /// `sluice.dev/native-sidecar`.
    pub native_sidecar: Option<bool>,
    /// `sluice.dev/job-queues`, in the order written, without duplicates.
    pub job_queues: Vec<String>,
}

/// A `sluice.dev/*` annotation with a value the webhook cannot use.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("annotation {annotation}: {value:?} {problem}")]
pub struct AnnotationError {
    /// The annotation key.
    pub annotation: &'static str,
    /// The value found.
    pub value: String,
    /// What is wrong and what to write instead.
    pub problem: &'static str,
}

impl InjectAnnotations {
    /// Parse the annotations of a pod. Only `sluice.dev/*` keys are read.
    pub fn parse(annotations: &BTreeMap<String, String>) -> Result<Self, AnnotationError> {
        let get = |k: &str| annotations.get(k).map(|v| v.trim());
        let err = |annotation, value: &str, problem| AnnotationError {
            annotation,
            value: value.to_owned(),
            problem,
        };
        let boolean = |annotation: &'static str| -> Result<Option<bool>, AnnotationError> {
            match get(annotation) {
                None => Ok(None),
                Some("true") => Ok(Some(true)),
                Some("false") => Ok(Some(false)),
                Some(v) => Err(err(
                    annotation,
                    v,
                    "is not a boolean: write \"true\" or \"false\"",
                )),
            }
        };
        let job_queues = match get(JOB_QUEUES) {
            None => vec![],
            Some(v) => {
                let mut names: Vec<String> = vec![];
                for name in v.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                    if !is_dns_subdomain(name) {
                        return Err(err(
                            JOB_QUEUES,
                            v,
                            "is not a comma-separated list of JobQueue names (lower-case letters, digits, '-' and '.')",
                        ));
                    }
                    if !names.iter().any(|n| n == name) {
                        names.push(name.to_owned());
                    }
                }
                if names.is_empty() {
                    return Err(err(
                        JOB_QUEUES,
                        v,
                        "names no JobQueue: write e.g. \"emails,reports\"",
                    ));
                }
                names
            }
        };
        // The job-queues annotation asks for the sidecar by itself; an explicit "false" still wins.
        let inject = boolean(INJECT)?.unwrap_or(!job_queues.is_empty());
        let native_sidecar = boolean(NATIVE_SIDECAR)?;
        let policy = match get(POLICY) {
            None => None,
            Some(v) if is_dns_label(v) => Some(v.to_owned()),
            Some(v) => {
                return Err(err(
                    POLICY,
                    v,
                    "is not a RateLimitPolicy name: lower-case letters, digits and '-', at most 63 characters",
                ));
            }
        };
        let app_port = match get(APP_PORT) {
            None => None,
            Some(v) => Some(parse_port_ref(v).ok_or_else(|| {
                err(
                    APP_PORT,
                    v,
                    "is neither a container port number (1-65535) nor a port name (e.g. http)",
                )
            })?),
        };
        let listen_port = match get(LISTEN_PORT) {
            None => None,
            Some(v) => Some(
                v.parse::<u16>()
                    .ok()
                    .filter(|p| *p > 0)
                    .ok_or_else(|| err(LISTEN_PORT, v, "is not a port number (1-65535)"))?,
            ),
        };
        Ok(Self {
            inject,
            policy,
            app_port,
            listen_port,
            native_sidecar,
            job_queues,
        })
    }
}

fn parse_port_ref(v: &str) -> Option<PortRef> {
    if v.bytes().all(|b| b.is_ascii_digit()) {
        return v.parse::<u16>().ok().filter(|p| *p > 0).map(PortRef::Number);
    }
    is_port_name(v).then(|| PortRef::Name(v.to_owned()))
}

/// IANA service name, as Kubernetes requires of container port names: at most 15 characters of
/// lower-case letters, digits and '-', at least one letter, no leading, trailing or double '-'.
pub fn is_port_name(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= 15
        && v.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && v.bytes().any(|b| b.is_ascii_lowercase())
        && !v.starts_with('-')
        && !v.ends_with('-')
        && !v.contains("--")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(pairs: &[(&str, &str)]) -> Result<InjectAnnotations, AnnotationError> {
        InjectAnnotations::parse(
            &pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    #[test]
    fn pod_without_annotations_asks_for_nothing() {
        assert_eq!(parse(&[]).unwrap(), InjectAnnotations::default());
    }

    #[test]
    fn every_annotation_is_read() {
        let a = parse(&[
            (INJECT, "true"),
            (POLICY, "api"),
            (APP_PORT, "http"),
            (LISTEN_PORT, "9000"),
            (NATIVE_SIDECAR, "false"),
            (JOB_QUEUES, " emails, reports ,emails"),
        ])
        .unwrap();
        assert_eq!(
            a,
            InjectAnnotations {
                inject: true,
                policy: Some("api".into()),
                app_port: Some(PortRef::Name("http".into())),
                listen_port: Some(9000),
                native_sidecar: Some(false),
                job_queues: vec!["emails".into(), "reports".into()],
            }
        );
        assert_eq!(
            parse(&[(APP_PORT, "8080")]).unwrap().app_port,
            Some(PortRef::Number(8080))
        );
    }

    #[test]
    fn bad_values_are_errors_naming_the_annotation() {
        for (key, value) in [
            (INJECT, "yes"),
            (INJECT, "True"),
            (POLICY, "My_Policy"),
            (POLICY, &"a".repeat(64)),
            (APP_PORT, "0"),
            (APP_PORT, "70000"),
            (APP_PORT, "Http"),
            (APP_PORT, "a-very-long-port-name"),
            (LISTEN_PORT, "http"),
            (LISTEN_PORT, "0"),
            (NATIVE_SIDECAR, "maybe"),
        ] {
            let err = parse(&[(INJECT, "true"), (key, value)]).unwrap_err();
            assert_eq!(err.annotation, key);
            assert!(
                err.to_string().starts_with(&format!("annotation {key}: ")),
                "{err}"
            );
        }
    }

    #[test]
    fn job_queues_ask_for_injection_unless_told_not_to_and_bad_names_are_refused() {
        assert!(parse(&[(JOB_QUEUES, "emails")]).unwrap().inject);
        assert!(
            !parse(&[(JOB_QUEUES, "emails"), (INJECT, "false")])
                .unwrap()
                .inject
        );
        let err = parse(&[(JOB_QUEUES, "Emails")]).unwrap_err();
        assert_eq!(err.annotation, JOB_QUEUES);
        let err = parse(&[(JOB_QUEUES, " , ")]).unwrap_err();
        assert!(err.to_string().contains("names no JobQueue"), "{err}");
    }
}
