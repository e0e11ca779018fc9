//! Job-queue settings of the sidecar: the worker role and the queue HTTP API served to the app.

use serde::{Deserialize, Serialize};

/// Job queue settings. The database URL normally comes from `SLUICE_DATABASE_URL`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct QueueConfig {
    /// PostgreSQL URL; overridden by `SLUICE_DATABASE_URL`. Prefer the env var: it comes from a Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub database_url: Option<String>,
}
