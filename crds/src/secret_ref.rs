//! A reference to one key of a Secret, the way both custom resources name their credentials
//! (`spec.redis.secretRef`, `spec.database.secretRef`). The value never leaves the Secret: the operator
//! hands it to pods by `secretKeyRef` and reads it itself only to connect.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The key read when a reference names none.
pub const SECRET_KEY_DEFAULT: &str = "url";

/// A key of a Secret in the object's own namespace, whose value is a connection URL.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// Name of the Secret.
    #[schemars(length(min = 1, max = 253))]
    #[schemars(regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"))]
    pub name: String,
    /// Key within the Secret whose value is the URL.
    #[serde(default = "default_key")]
    #[schemars(length(min = 1, max = 253))]
    #[schemars(regex(pattern = r"^[-._a-zA-Z0-9]+$"))]
    pub key: String,
}

fn default_key() -> String {
    SECRET_KEY_DEFAULT.into()
}
