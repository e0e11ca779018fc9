//! Bad `sluice.dev/*` annotations on a pod being created, each with the annotation its refusal names and
//! a word of what it says (`operator/tests/bad_input_annotations.rs` sends each to the injection webhook
//! as the API server does). Data only: the count of bad inputs in docs/security.md reads this table too.
//!
//! The pod: labels `app: web`, one container `web` with ports `http` 8080 and `metrics` 9090. The
//! namespace: RateLimitPolicy `api` (selecting `app: web`), `spare` (selecting nothing), JobQueues
//! `emails` and `reports` (Secret `pg`) and `audit` (Secret `audit-db`).

/// One pod's annotations.
pub struct Case {
    pub annotations: &'static [(&'static str, &'static str)],
    /// The annotation the refusal names.
    pub annotation: &'static str,
    /// Words the refusal contains.
    pub says: &'static str,
}

const INJECT: &str = "sluice.dev/inject";
const POLICY: &str = "sluice.dev/policy";
const APP_PORT: &str = "sluice.dev/app-port";
const LISTEN_PORT: &str = "sluice.dev/listen-port";
const NATIVE: &str = "sluice.dev/native-sidecar";
const QUEUES: &str = "sluice.dev/job-queues";

const fn case(
    annotations: &'static [(&'static str, &'static str)],
    annotation: &'static str,
    says: &'static str,
) -> Case {
    Case {
        annotations,
        annotation,
        says,
    }
}

pub const CASES: &[Case] = &[
    // sluice.dev/inject
    case(&[(INJECT, "yes")], INJECT, "not a boolean"),
    case(&[(INJECT, "True")], INJECT, "not a boolean"),
    case(&[(INJECT, "TRUE")], INJECT, "not a boolean"),
    case(&[(INJECT, "1")], INJECT, "not a boolean"),
    case(&[(INJECT, "on")], INJECT, "not a boolean"),
    case(&[(INJECT, "")], INJECT, "not a boolean"),
    case(&[(INJECT, "true false")], INJECT, "not a boolean"),
    case(&[(INJECT, "\"true\"")], INJECT, "not a boolean"),
    case(&[(INJECT, "yes"), (POLICY, "api")], INJECT, "not a boolean"),
    // sluice.dev/native-sidecar
    case(
        &[(INJECT, "true"), (POLICY, "api"), (NATIVE, "maybe")],
        NATIVE,
        "not a boolean",
    ),
    case(
        &[(INJECT, "true"), (POLICY, "api"), (NATIVE, "0")],
        NATIVE,
        "not a boolean",
    ),
    case(
        &[(INJECT, "true"), (POLICY, "api"), (NATIVE, "False")],
        NATIVE,
        "not a boolean",
    ),
    // sluice.dev/policy
    case(
        &[(INJECT, "true"), (POLICY, "My_Policy")],
        POLICY,
        "not a RateLimitPolicy name",
    ),
    case(
        &[
            (INJECT, "true"),
            (
                POLICY,
                "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
            ),
        ],
        POLICY,
        "at most 63 characters",
    ),
    case(
        &[(INJECT, "true"), (POLICY, "api.v1")],
        POLICY,
        "not a RateLimitPolicy name",
    ),
    case(
        &[(INJECT, "true"), (POLICY, "-api")],
        POLICY,
        "not a RateLimitPolicy name",
    ),
    case(
        &[(INJECT, "true"), (POLICY, "api-")],
        POLICY,
        "not a RateLimitPolicy name",
    ),
    case(
        &[(INJECT, "true"), (POLICY, "")],
        POLICY,
        "not a RateLimitPolicy name",
    ),
    case(
        &[(INJECT, "true"), (POLICY, "äpi")],
        POLICY,
        "not a RateLimitPolicy name",
    ),
    case(
        &[(INJECT, "true"), (POLICY, "api,spare")],
        POLICY,
        "not a RateLimitPolicy name",
    ),
    case(
        &[(INJECT, "true"), (POLICY, "checkout")],
        POLICY,
        "does not exist",
    ),
    case(&[(INJECT, "true"), (POLICY, "apis")], POLICY, "does not exist"),
    // sluice.dev/app-port
    case(
        &[(INJECT, "true"), (POLICY, "api"), (APP_PORT, "0")],
        APP_PORT,
        "neither a container port number",
    ),
    case(
        &[(INJECT, "true"), (POLICY, "api"), (APP_PORT, "70000")],
        APP_PORT,
        "neither a container port number",
    ),
    case(
        &[(INJECT, "true"), (POLICY, "api"), (APP_PORT, "Http")],
        APP_PORT,
        "neither a container port number",
    ),
    case(
        &[
            (INJECT, "true"),
            (POLICY, "api"),
            (APP_PORT, "a-very-long-port-name"),
        ],
        APP_PORT,
        "neither a container port number",
    ),
    case(
        &[(INJECT, "true"), (POLICY, "api"), (APP_PORT, "-http")],
        APP_PORT,
        "neither a container port number",
    ),
    case(
        &[(INJECT, "true"), (POLICY, "api"), (APP_PORT, "http-")],
        APP_PORT,
        "neither a container port number",
    ),
    case(
        &[(INJECT, "true"), (POLICY, "api"), (APP_PORT, "ht--tp")],
        APP_PORT,
        "neither a container port number",
    ),
    case(
        &[(INJECT, "true"), (POLICY, "api"), (APP_PORT, "8080.0")],
        APP_PORT,
        "neither a container port number",
    ),
    case(
        &[(INJECT, "true"), (POLICY, "api"), (APP_PORT, "-1")],
        APP_PORT,
        "neither a container port number",
    ),
    case(
        &[(INJECT, "true"), (POLICY, "api"), (APP_PORT, "80/tcp")],
        APP_PORT,
        "neither a container port number",
    ),
    case(
        &[(INJECT, "true"), (POLICY, "api"), (APP_PORT, "")],
        APP_PORT,
        "neither a container port number",
    ),
    case(
        &[(INJECT, "true"), (POLICY, "api"), (APP_PORT, "grpc")],
        APP_PORT,
        "no container of this pod has a port named",
    ),
    case(
        &[(INJECT, "true"), (POLICY, "api"), (APP_PORT, "metricz")],
        APP_PORT,
        "no container of this pod",
    ),
    // sluice.dev/listen-port
    case(
        &[(INJECT, "true"), (POLICY, "api"), (LISTEN_PORT, "http")],
        LISTEN_PORT,
        "not a port number",
    ),
    case(
        &[(INJECT, "true"), (POLICY, "api"), (LISTEN_PORT, "0")],
        LISTEN_PORT,
        "not a port number",
    ),
    case(
        &[(INJECT, "true"), (POLICY, "api"), (LISTEN_PORT, "65536")],
        LISTEN_PORT,
        "not a port number",
    ),
    case(
        &[(INJECT, "true"), (POLICY, "api"), (LISTEN_PORT, "-80")],
        LISTEN_PORT,
        "not a port number",
    ),
    case(
        &[(INJECT, "true"), (POLICY, "api"), (LISTEN_PORT, "80.5")],
        LISTEN_PORT,
        "not a port number",
    ),
    case(
        &[(INJECT, "true"), (POLICY, "api"), (LISTEN_PORT, "8080")],
        LISTEN_PORT,
        "already used by a container",
    ),
    case(
        &[(INJECT, "true"), (POLICY, "api"), (LISTEN_PORT, "9090")],
        LISTEN_PORT,
        "already used by a container",
    ),
    case(
        &[(INJECT, "true"), (POLICY, "api"), (LISTEN_PORT, "15021")],
        LISTEN_PORT,
        "reserved",
    ),
    // sluice.dev/job-queues
    case(
        &[(QUEUES, "Emails")],
        QUEUES,
        "not a comma-separated list of JobQueue names",
    ),
    case(&[(QUEUES, " , ")], QUEUES, "names no JobQueue"),
    case(&[(QUEUES, "")], QUEUES, "names no JobQueue"),
    case(
        &[(QUEUES, "emails;reports")],
        QUEUES,
        "not a comma-separated list",
    ),
    case(
        &[(QUEUES, "emails, Reports")],
        QUEUES,
        "not a comma-separated list",
    ),
    case(&[(QUEUES, "a_b")], QUEUES, "not a comma-separated list"),
    case(&[(QUEUES, "-emails")], QUEUES, "not a comma-separated list"),
    case(
        &[(QUEUES, "emails reports")],
        QUEUES,
        "not a comma-separated list",
    ),
    case(&[(QUEUES, "payments")], QUEUES, "does not exist"),
    case(&[(QUEUES, "emails,payments")], QUEUES, "does not exist"),
    case(&[(QUEUES, "emails,audit")], QUEUES, "different database Secrets"),
    case(&[(QUEUES, "emails"), (INJECT, "maybe")], INJECT, "not a boolean"),
    // Several annotations, one wrong.
    case(
        &[
            (INJECT, "true"),
            (POLICY, "api"),
            (APP_PORT, "http"),
            (LISTEN_PORT, "99999"),
        ],
        LISTEN_PORT,
        "not a port number",
    ),
    case(
        &[(INJECT, "true"), (POLICY, "API")],
        POLICY,
        "not a RateLimitPolicy name",
    ),
];
