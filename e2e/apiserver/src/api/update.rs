//! UPDATE (PUT): the whole object replaced, or the Scale of `/scale`; custom resources need a
//! resourceVersion.

use serde_json::Value;

use super::checks::{check_kind, precondition};
use crate::error::{ApiError, Cause};
use crate::registry::present;
use crate::target::Target;

/// The object a PUT asks for in place of `old`, before the server-side rules.
pub fn desired(t: &Target, old: &Value, body: &Value) -> Result<Value, ApiError> {
    let rt = &t.rt;
    let scale = t.sub.as_deref() == Some("scale");
    let mut obj = body.clone();
    if !scale {
        check_kind(rt, &obj)?;
    }
    precondition(rt, t.name(), old, &obj)?;
    // Custom resources allow no unconditional updates (built-ins mostly do).
    if rt.custom
        && !scale
        && obj["metadata"]["resourceVersion"]
            .as_str()
            .is_none_or(str::is_empty)
    {
        return Err(ApiError::invalid(
            rt,
            t.name(),
            vec![Cause::new(
                "FieldValueInvalid",
                "metadata.resourceVersion",
                "Invalid value: 0x0: must be specified for an update",
            )],
        ));
    }
    if scale {
        obj = crate::scale::from_scale(rt, old, &obj)?;
    }
    Ok(present(rt, obj))
}
