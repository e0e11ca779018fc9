//! An in-memory Kubernetes API server that kube-runtime and real `kubectl` accept, for Sluice's tests and
//! `make sandbox`. It stores objects in memory, serves discovery, OpenAPI, watches, server-side apply,
//! CRDs with schema and CEL validation, mutating webhooks and API aggregation; it runs no controllers
//! (the stand-ins for those live in the `sluice-e2e` crate, which starts them beside it).
//!
//! # Layout
//!
//! Dependencies point down this list; nothing here knows Sluice or its runtime crates.
//!
//! - [`server`]: [`TestApiServer`] — listener, TLS, the in-process handle tests use.
//! - [`api`]: authentication and routing, then one module per verb ([`api::get`], [`api::list`],
//!   [`api::watch`], [`api::create`], [`api::update`], [`api::patch`], [`api::apply`], [`api::delete`])
//!   and what the writes share ([`api::write`]).
//! - [`admission`]: mutating webhooks; [`aggregator`]: APIService proxying; [`discovery`], [`openapi`],
//!   [`table`]: the documents clients read about the types.
//! - [`state`]: [`State`], what every handler shares, and the [`Options`] a server starts with;
//!   [`target`]: what a resource path names; [`request`]: a parsed request; [`user`]: its caller;
//!   [`response`]: JSON answers and `Status` errors; [`front_proxy`]: the aggregator's client identity.
//! - [`store`]: objects, the resourceVersion counter, change history, finalizers, garbage collection.
//! - [`registry`], [`builtins`], [`crd`], [`scale`]: the types served.
//! - [`merge`], [`shape`], [`fieldset`]: strategic merge patch and server-side apply with managedFields.
//! - [`validation`]: CRD schema checks, pruning, defaults and CEL rules; [`selectors`]: label and field
//!   selectors; [`protobuf`]: protobuf request bodies of built-in kinds, read as JSON.
//! - [`tls`], [`kubeconfig`]: certificates and the kubeconfig clients use; [`error`]: errors.

pub mod admission;
pub mod aggregator;
pub mod api;
pub mod builtins;
pub mod crd;
pub mod discovery;
pub mod error;
pub mod fieldset;
pub mod front_proxy;
pub mod kubeconfig;
pub mod merge;
pub mod openapi;
pub mod protobuf;
pub mod registry;
pub mod request;
pub mod response;
pub mod scale;
pub mod selectors;
pub mod server;
pub mod shape;
pub mod state;
pub mod store;
pub mod table;
pub mod target;
pub mod tls;
pub mod user;
pub mod validation;

pub use error::{ApiError, Error, Result};
pub use server::TestApiServer;
pub use state::{Options, State, TOKEN_DEFAULT};
pub use user::User;
