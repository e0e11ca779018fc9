//! Test-only support for Sluice: throwaway `redis-server` and PostgreSQL processes on free ports in temp
//! dirs, and waiting for a condition with a deadline instead of sleeping.
//!
//! Every server here belongs to the test that started it, so a test may stop it, freeze it (SIGSTOP),
//! thaw it and restart it on the same port; dropping the handle kills the process and removes its files.
//! No test relies on a server somebody else started (the machine's own servers on 6379/5432 are never used).
//!
//! Layout: [`wait`] (deadlines), [`process`] (child processes and signals), [`redis`], [`postgres`].

mod postgres;
mod process;
mod redis;
mod wait;

pub use postgres::{Frozen, PgServer};
pub use process::{Signal, free_port};
pub use redis::RedisServer;
pub use wait::{wait_for, wait_for_async};
