//! A kind followed for as long as the caller listens: watches resumed from the last
//! resourceVersion (objects and bookmarks move it) when the server ends them or the connection
//! breaks, at the client's pace; a resourceVersion too old, in any of its forms, ends the
//! following for a new list. [`KubeClient::watcher`] does that list too, as often as needed.

use crate::client::{KubeClient, Listed};
use crate::error::KubeError;
use crate::resource::{Kind, Object, Selector};
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use kube::core::WatchEvent;
use std::time::{Duration, Instant};

/// A watch that ends sooner than this without an event is a failure, not the server's
/// timeout (client-go's reflector calls it a very short watch).
const SHORT_WATCH: Duration = Duration::from_secs(1);

/// What following a kind from a resourceVersion brings.
#[derive(Debug, Clone, PartialEq)]
pub enum Followed<T> {
    /// Created or changed.
    Applied(T),
    /// Deleted: the object as it was last.
    Deleted(T),
    /// The server says the watch is current up to here, without a change (a bookmark).
    Bookmark,
    /// The resourceVersion left the server's window (410, as the watch's answer or as an
    /// ERROR event in it): list again. The last item.
    Expired(String),
}

/// What watching a kind brings: a complete list, then its changes.
#[derive(Debug, Clone, PartialEq)]
pub enum Event<T> {
    /// Every object selected now: what was known before is replaced by these (the first
    /// item, and again after each relist).
    Listed(Vec<T>),
    Applied(T),
    Deleted(T),
}

/// A watch in progress: its events, when it began, how many it gave.
struct Current<T> {
    events: BoxStream<'static, Result<WatchEvent<T>, KubeError>>,
    started: Instant,
    seen: usize,
}

struct Following<T> {
    client: KubeClient,
    kind: Kind,
    selector: Selector,
    resource_version: String,
    current: Option<Current<T>>,
    ended: bool,
}

impl<T: Object> Following<T> {
    async fn next(&mut self) -> Option<Result<Followed<T>, KubeError>> {
        loop {
            if self.ended {
                return None;
            }
            let Some(cur) = self.current.as_mut() else {
                match self
                    .client
                    .watch::<T>(self.kind, &self.selector, &self.resource_version)
                    .await
                {
                    Ok(events) => {
                        self.current = Some(Current {
                            events: events.boxed(),
                            started: Instant::now(),
                            seen: 0,
                        })
                    }
                    Err(KubeError::Expired(m)) => {
                        self.ended = true;
                        return Some(Ok(Followed::Expired(m)));
                    }
                    Err(e) => {
                        if !paced(&e) {
                            self.client.note_failure();
                        }
                        return Some(Err(e));
                    }
                }
                continue;
            };
            let item = cur.events.next().await;
            let Some(item) = item else {
                let short = cur.seen == 0 && cur.started.elapsed() < SHORT_WATCH;
                self.current = None;
                if short {
                    self.client.note_failure();
                    return Some(Err(KubeError::Unavailable(format!(
                        "the API server at {} ended the watch at once, with no event",
                        self.client.server()
                    ))));
                }
                continue;
            };
            cur.seen += 1;
            let ev = match item {
                Ok(ev) => ev,
                Err(e) => {
                    self.current = None;
                    return Some(Err(e));
                }
            };
            return Some(Ok(match ev {
                WatchEvent::Added(o) | WatchEvent::Modified(o) => {
                    self.resource_version = o.resource_version().to_string();
                    Followed::Applied(o)
                }
                WatchEvent::Deleted(o) => {
                    self.resource_version = o.resource_version().to_string();
                    Followed::Deleted(o)
                }
                WatchEvent::Bookmark(b) => {
                    self.resource_version = b.metadata.resource_version;
                    Followed::Bookmark
                }
                WatchEvent::Error(e) if e.code == 410 => {
                    self.ended = true;
                    Followed::Expired(e.message)
                }
                WatchEvent::Error(e) => {
                    self.current = None;
                    self.client.note_failure();
                    return Some(Err(KubeError::Refused(format!(
                        "watch {}: {} ({} {})",
                        self.kind.plural, e.message, e.code, e.reason
                    ))));
                }
            }));
        }
    }
}

/// Whether the client's pace already counted this failure (send counts what waiting mends).
fn paced(e: &KubeError) -> bool {
    matches!(
        e,
        KubeError::Unavailable(_) | KubeError::Unauthenticated(_) | KubeError::Denied { .. }
    )
}

impl KubeClient {
    /// The changes of the objects `selector` selects after `resource_version` (a list's),
    /// for as long as the stream is read: each watch the server ends is resumed from the last
    /// resourceVersion; a failure is an `Err` item, and the watch is tried again when the
    /// client's pace allows. Ends after [`Followed::Expired`].
    pub fn follow<T: Object>(
        &self,
        kind: Kind,
        selector: &Selector,
        resource_version: &str,
    ) -> impl Stream<Item = Result<Followed<T>, KubeError>> + Send + use<T> {
        let state = Following::<T> {
            client: self.clone(),
            kind,
            selector: selector.clone(),
            resource_version: resource_version.to_string(),
            current: None,
            ended: false,
        };
        futures::stream::unfold(state, |mut s| async move {
            let item = s.next().await?;
            Some((item, s))
        })
    }

    /// The objects `selector` selects, listed and then followed, for as long as the stream is
    /// read: [`Event::Listed`] first and again whenever the watch's resourceVersion is too
    /// old, then each change. A failure is an `Err` item, retried when the client's pace
    /// allows. The shape of client-go's reflector, or kube-runtime's watcher.
    pub fn watcher<T: Object>(
        &self,
        kind: Kind,
        selector: &Selector,
    ) -> impl Stream<Item = Result<Event<T>, KubeError>> + Send + use<T> {
        enum State<T> {
            List,
            Follow(BoxStream<'static, Result<Followed<T>, KubeError>>),
        }
        let (client, selector) = (self.clone(), selector.clone());
        futures::stream::unfold(State::<T>::List, move |state| {
            let (client, selector) = (client.clone(), selector.clone());
            async move {
                let mut state = state;
                loop {
                    match state {
                        State::List => match client.list::<T>(kind, &selector).await {
                            Ok(Listed {
                                items,
                                resource_version,
                            }) => {
                                let next = client
                                    .follow::<T>(kind, &selector, &resource_version)
                                    .boxed();
                                return Some((Ok(Event::Listed(items)), State::Follow(next)));
                            }
                            Err(e) => {
                                if !paced(&e) {
                                    client.note_failure();
                                }
                                return Some((Err(e), State::List));
                            }
                        },
                        State::Follow(mut s) => {
                            let item = match s.next().await {
                                None | Some(Ok(Followed::Expired(_))) => {
                                    state = State::List;
                                    continue;
                                }
                                Some(Ok(Followed::Bookmark)) => {
                                    state = State::Follow(s);
                                    continue;
                                }
                                Some(Ok(Followed::Applied(o))) => Ok(Event::Applied(o)),
                                Some(Ok(Followed::Deleted(o))) => Ok(Event::Deleted(o)),
                                Some(Err(e)) => Err(e),
                            };
                            return Some((item, State::Follow(s)));
                        }
                    }
                }
            }
        })
    }
}
