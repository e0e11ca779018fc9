//! The sandbox's live view: one line per second with what the rate limiter and the queue did in it.
//! Pure formatting, so its shape is tested without running anything.

/// What one second of the demo looked like.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sample {
    /// Seconds since the demo started.
    pub second: u64,
    /// Requests the sidecars let through in that second.
    pub allowed: u64,
    /// Requests answered 429.
    pub limited: u64,
    /// Requests that failed otherwise (connection refused, 5xx).
    pub errors: u64,
    /// The policy's current limit per second.
    pub limit: u64,
    /// Whether Redis is up (`None`: the sandbox runs without Redis).
    pub redis_up: Option<bool>,
    /// The queue, when PostgreSQL runs.
    pub queue: Option<QueueSample>,
}

/// The queue's state at the end of a second.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct QueueSample {
    /// Jobs waiting.
    pub ready: u64,
    /// Jobs being handled.
    pub running: u64,
    /// Jobs done since the sandbox started.
    pub succeeded: u64,
    /// Worker replicas wanted (the Deployment's `spec.replicas`).
    pub replicas: i32,
    /// Worker replicas Ready.
    pub ready_replicas: i32,
}

/// The header printed above the lines.
pub fn header() -> String {
    format!(
        "{:>5} │ {:>8} {:>8} {:>6}  {:<14} │ {:>6} {:>7} {:>6}  {}",
        "time", "allowed", "limited", "limit", "redis", "queued", "running", "done", "workers"
    )
}

/// One line of the live view.
pub fn line(s: &Sample) -> String {
    let redis = match s.redis_up {
        Some(true) => "up",
        Some(false) => "DOWN (local)",
        None => "absent (local)",
    };
    let errors = if s.errors > 0 {
        format!("  {} errors", s.errors)
    } else {
        String::new()
    };
    let queue = match &s.queue {
        Some(q) => format!(
            "{:>6} {:>7} {:>6}  {} {}",
            q.ready,
            q.running,
            q.succeeded,
            bar(q.replicas),
            if q.ready_replicas == q.replicas {
                format!("{}", q.replicas)
            } else {
                format!("{} ({} ready)", q.replicas, q.ready_replicas)
            }
        ),
        None => "(no PostgreSQL: queue demo off)".into(),
    };
    format!(
        "{:>4}s │ {:>6}/s {:>6}/s {:>4}/s  {:<14} │ {queue}{errors}",
        s.second, s.allowed, s.limited, s.limit, redis
    )
}

/// Replicas as a bar of blocks, so scaling reads at a glance.
fn bar(replicas: i32) -> String {
    let n = replicas.clamp(0, 20) as usize;
    format!("{:<5}", "█".repeat(n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_shows_both_demos_and_the_replica_bar() {
        let s = Sample {
            second: 12,
            allowed: 20,
            limited: 30,
            errors: 0,
            limit: 20,
            redis_up: Some(true),
            queue: Some(QueueSample {
                ready: 1200,
                running: 16,
                succeeded: 784,
                replicas: 4,
                ready_replicas: 3,
            }),
        };
        let l = line(&s);
        assert!(l.starts_with("  12s │     20/s     30/s   20/s  up "), "{l}");
        assert!(l.contains("  1200      16    784  ████  4 (3 ready)"), "{l}");
    }

    #[test]
    fn a_line_says_when_redis_or_postgres_are_missing() {
        let s = Sample {
            redis_up: None,
            errors: 2,
            ..Sample::default()
        };
        let l = line(&s);
        assert!(l.contains("absent (local)"), "{l}");
        assert!(l.contains("no PostgreSQL"), "{l}");
        assert!(l.ends_with("2 errors"), "{l}");
    }
}
