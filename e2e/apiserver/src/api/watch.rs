//! WATCH: newline-delimited JSON events over a chunked response. Replays from a resourceVersion, answers
//! too-old versions with an `ERROR` event carrying a 410 Status, sends bookmarks when allowed, streams
//! initial events ending in a `k8s.io/initial-events-end` bookmark for `sendInitialEvents=true`, and
//! closes after `timeoutSeconds`.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt as _;
use http::{Response, header};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;

use crate::error::ApiError;
use crate::registry::{ResourceType, present};
use crate::request::Req;
use crate::response::Body;
use crate::selectors::{FieldSelector, LabelSelector};
use crate::state::State;
use crate::store::{Clock, Event, EventType, Message};
use crate::target::Target;

/// Default watch duration when the client gives no `timeoutSeconds` (kube-apiserver picks 30–60 min).
pub const TIMEOUT_DEFAULT: Duration = Duration::from_secs(1800);

struct Filter {
    rt: Arc<ResourceType>,
    namespace: Option<String>,
    labels: LabelSelector,
    fields: FieldSelector,
}

impl Filter {
    fn selects(&self, obj: &Value) -> bool {
        self.labels.matches(obj["metadata"].get("labels")) && self.fields.matches(obj)
    }

    /// The event type this watch sees, if any: an object that starts matching the selectors is ADDED, one
    /// that stops matching is DELETED, as kube-apiserver reports them.
    fn view(&self, e: &Event) -> Option<&'static str> {
        if e.res != self.rt.key() || self.namespace.as_ref().is_some_and(|ns| *ns != e.namespace) {
            return None;
        }
        let now = self.selects(&e.object);
        let before = e.previous.as_ref().is_some_and(|p| self.selects(p));
        match (e.type_, before, now) {
            (EventType::Modified, false, true) => Some("ADDED"),
            (EventType::Modified, true, false) => Some("DELETED"),
            (_, _, true) => Some(e.type_.as_str()),
            _ => None,
        }
    }
}

fn line(type_: &str, object: Value) -> Bytes {
    let mut s = serde_json::to_vec(&json!({"type": type_, "object": object})).unwrap_or_default();
    s.push(b'\n');
    Bytes::from(s)
}

fn bookmark(rt: &ResourceType, rv: u64, initial_end: bool) -> Bytes {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    line(
        "BOOKMARK",
        json!({"apiVersion": rt.api_version(), "kind": rt.kind, "metadata": meta}),
    )
}

/// Starts a watch.
pub fn serve(state: &Arc<State>, t: &Target, req: &Req) -> Result<Response<Body>, ApiError> {
    let (labels, fields) = req.selectors()?;
    let filter = Filter {
        rt: t.rt.clone(),
        namespace: t.namespace.clone(),
        labels,
        fields,
    };
    let bookmarks = req.q("allowWatchBookmarks") == Some("true");
    let send_initial = req.q("sendInitialEvents") == Some("true");
    let timeout = req
        .q("timeoutSeconds")
        .and_then(|s| s.parse().ok())
        .map(Duration::from_secs)
        .unwrap_or(TIMEOUT_DEFAULT);
    let table = crate::table::wants_table(req);
    let rv = req.q("resourceVersion").map(|s| {
        s.parse::<u64>()
            .map_err(|_| ApiError::bad_request(format!("invalid resource version: {s}")))
    });
    let rv = rv.transpose()?;

    let clock = state.options.clock.clone();
    let (tx, rx) = mpsc::channel::<Bytes>(256);
    let mut first: Vec<Bytes> = vec![];
    let subscription: Option<broadcast::Receiver<Message>>;
    let mut last_rv;
    {
        let store = state.store();
        last_rv = store.current_rv();
        let initial = send_initial || matches!(rv, None | Some(0));
        if initial {
            for o in store.list(&t.rt.key(), t.namespace.as_deref()) {
                if filter.selects(o) {
                    first.push(render(
                        &filter.rt,
                        "ADDED",
                        o.clone(),
                        table,
                        first.is_empty(),
                        &clock,
                    ));
                }
            }
            if send_initial && bookmarks {
                first.push(bookmark(&t.rt, last_rv, true));
            }
            subscription = Some(store.subscribe());
        } else {
            let from = rv.unwrap_or_default();
            match store.subscribe_from(from) {
                Ok((replay, sub)) => {
                    for e in &replay {
                        if let Some(type_) = filter.view(e) {
                            first.push(render(
                                &filter.rt,
                                type_,
                                e.object.clone(),
                                table,
                                first.is_empty(),
                                &clock,
                            ));
                        }
                    }
                    subscription = Some(sub);
                }
                Err(floor) => {
                    let gone = ApiError::expired(format!("too old resource version: {from} ({floor})"));
                    first.push(line("ERROR", gone.to_status()));
                    subscription = None;
                }
            }
        }
    }
    let rt = t.rt.clone();
    let interval = state.options.bookmark_interval;
    let mut shutdown = state.shutdown.clone();
    tokio::spawn(async move {
        let mut sent_any = !first.is_empty();
        for b in first {
            if tx.send(b).await.is_err() {
                return;
            }
        }
        let Some(mut sub) = subscription else { return };
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut tick = tokio::time::interval(interval);
        tick.tick().await;
        loop {
            tokio::select! {
                m = sub.recv() => match m {
                    Ok(Message::Event(e)) => {
                        if e.rv <= last_rv && e.rv != 0 {
                            continue;
                        }
                        last_rv = e.rv;
                        if let Some(type_) = filter.view(&e) {
                            let b = render(&rt, type_, e.object.clone(), table, !sent_any, &clock);
                            sent_any = true;
                            if tx.send(b).await.is_err() {
                                return;
                            }
                        }
                    }
                    Ok(Message::Compacted) | Err(broadcast::error::RecvError::Lagged(_)) | Err(broadcast::error::RecvError::Closed) => return,
                },
                _ = tick.tick(), if bookmarks => {
                    if tx.send(bookmark(&rt, last_rv, false)).await.is_err() {
                        return;
                    }
                }
                _ = &mut deadline => {
                    if bookmarks {
                        let _ = tx.send(bookmark(&rt, last_rv, false)).await;
                    }
                    return;
                }
                _ = tx.closed() => return,
                _ = shutdown.changed() => return,
            }
        }
    });
    let stream = ReceiverStream::new(rx).map(|b| Ok::<_, Infallible>(Frame::data(b)));
    let content_type = if table {
        "application/json;as=Table;v=v1;g=meta.k8s.io"
    } else {
        "application/json"
    };
    Ok(Response::builder()
        .status(200)
        .header(header::CONTENT_TYPE, content_type)
        .header(header::CACHE_CONTROL, "no-cache, private")
        .body(BodyExt::boxed(StreamBody::new(stream)))
        .expect("a static response is valid"))
}

fn render(
    rt: &ResourceType,
    type_: &str,
    object: Value,
    table: bool,
    with_columns: bool,
    clock: &Clock,
) -> Bytes {
    let object = present(rt, object);
    if !table {
        return line(type_, object);
    }
    let mut t = json!({
        "kind": "Table", "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": object["metadata"]["resourceVersion"]},
        "rows": [crate::table::row(rt, &object, "Metadata", clock())],
    });
    t["columnDefinitions"] = if with_columns {
        json!(crate::table::columns(rt))
    } else {
        json!([])
    };
    line(type_, t)
}
