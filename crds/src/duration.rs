//! Durations written the way Kubernetes users write them: `50ms`, `30s`, `5m`, `1h30m`.
//!
//! Used by the sidecar config and the CRDs alike, so a window that validates in a `RateLimitPolicy`
//! renders to a config the sidecar accepts. Any length is allowed (30 s and 5 min windows included),
//! not only s/m/h/d.

use std::{fmt, str::FromStr, time::Duration as StdDuration};

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The units a duration may use, longest suffix first so `ms` is not read as `m`.
const UNITS: [(&str, u64); 5] = [
    ("ms", 1),
    ("s", 1_000),
    ("m", 60_000),
    ("h", 3_600_000),
    ("d", 86_400_000),
];

/// A whole number of milliseconds, written as `1h30m`, `30s` or `250ms`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Duration(StdDuration);

/// Why a duration string did not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0:?} is not a duration: use a number and a unit (ms, s, m, h, d), e.g. 30s, 5m, 1h30m")]
pub struct ParseDurationError(pub String);

impl Duration {
    /// A duration of `ms` milliseconds.
    pub const fn from_millis(ms: u64) -> Self {
        Self(StdDuration::from_millis(ms))
    }

    /// A duration of `s` seconds.
    pub const fn from_secs(s: u64) -> Self {
        Self(StdDuration::from_secs(s))
    }

    /// The standard-library value.
    pub const fn get(self) -> StdDuration {
        self.0
    }

    /// Whole milliseconds.
    pub fn as_millis(self) -> u64 {
        u64::try_from(self.0.as_millis()).unwrap_or(u64::MAX)
    }
}

impl From<StdDuration> for Duration {
    fn from(d: StdDuration) -> Self {
        Self(d)
    }
}

impl From<Duration> for StdDuration {
    fn from(d: Duration) -> Self {
        d.0
    }
}

impl FromStr for Duration {
    type Err = ParseDurationError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseDurationError(s.to_owned());
        let mut rest = s.trim();
        if rest.is_empty() {
            return Err(err());
        }
        let mut total: u64 = 0;
        while !rest.is_empty() {
            let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(err)?;
            if digits == 0 {
                return Err(err());
            }
            let n: u64 = rest[..digits].parse().map_err(|_| err())?;
            rest = &rest[digits..];
            let (unit, ms) = UNITS.iter().find(|(u, _)| rest.starts_with(u)).ok_or_else(err)?;
            rest = &rest[unit.len()..];
            total = n
                .checked_mul(*ms)
                .and_then(|v| total.checked_add(v))
                .ok_or_else(err)?;
        }
        Ok(Self::from_millis(total))
    }
}

impl fmt::Display for Duration {
    /// The shortest form that reads back to the same value: `90s` is written `1m30s`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut ms = self.as_millis();
        if ms == 0 {
            return f.write_str("0s");
        }
        for (unit, size) in UNITS.iter().rev() {
            if ms >= *size {
                write!(f, "{}{unit}", ms / size)?;
                ms %= size;
            }
        }
        Ok(())
    }
}

impl Serialize for Duration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for Duration {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Duration".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "pattern": "^([0-9]+(ms|s|m|h|d))+$",
            "description": "A duration: a number and a unit (ms, s, m, h, d), e.g. 30s, 5m, 1h30m."
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_any_window_length_users_write() {
        for (text, ms) in [
            ("1s", 1_000),
            ("30s", 30_000),
            ("5m", 300_000),
            ("15m", 900_000),
            ("1h", 3_600_000),
        ] {
            assert_eq!(text.parse::<Duration>().unwrap().as_millis(), ms, "{text}");
        }
        assert_eq!("1h30m".parse::<Duration>().unwrap().as_millis(), 5_400_000);
        assert_eq!("250ms".parse::<Duration>().unwrap().as_millis(), 250);
    }

    #[test]
    fn rejects_what_is_not_a_duration_naming_it() {
        for bad in ["", "5", "m", "5x", "-5s", "1.5s", "5 m", "99999999999999999999d"] {
            let err = bad.parse::<Duration>().unwrap_err();
            assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
        }
    }

    #[test]
    fn display_round_trips_in_shortest_form() {
        for text in ["0s", "50ms", "1m30s", "1h", "2d3h", "1s500ms"] {
            assert_eq!(text.parse::<Duration>().unwrap().to_string(), text);
        }
        assert_eq!("90s".parse::<Duration>().unwrap().to_string(), "1m30s");
    }
}
