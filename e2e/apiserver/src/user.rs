//! [`User`]: who sent a request, as the bearer token authenticated it.

/// An authenticated caller of the server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct User {
    /// User name.
    pub username: String,
    /// Groups.
    pub groups: Vec<String>,
}

impl User {
    /// The user the default bearer token authenticates as: a cluster admin.
    pub fn admin() -> Self {
        User {
            username: "sluice-test-admin".into(),
            groups: vec!["system:masters".into(), "system:authenticated".into()],
        }
    }
}
