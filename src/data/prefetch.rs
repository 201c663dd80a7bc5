//! `BackgroundGenerator`: runs any iterator on its own thread, a bounded number of items
//! ahead of the consumer (the `prefetch_generator` package's class of that name).

use std::sync::mpsc::{Receiver, sync_channel};
use std::thread::JoinHandle;

/// An iterator whose items are produced on a background thread.
pub struct Prefetch<T> {
    rx: Option<Receiver<T>>,
    handle: Option<JoinHandle<()>>,
}

/// Wraps an iterator so a thread produces up to `max_prefetch` items ahead.
pub struct BackgroundGenerator;

impl BackgroundGenerator {
    /// Starts producing `iter`'s items on a new thread; at most `max_prefetch` (at least 1)
    /// wait in the queue. Dropping the result stops the thread after its current item.
    #[allow(clippy::new_ret_no_self)]
    pub fn new<I>(iter: I, max_prefetch: usize) -> Prefetch<I::Item>
    where
        I: Iterator + Send + 'static,
        I::Item: Send + 'static,
    {
        let (tx, rx) = sync_channel(max_prefetch.max(1));
        let handle = std::thread::spawn(move || {
            for item in iter {
                if tx.send(item).is_err() {
                    break;
                }
            }
        });
        Prefetch {
            rx: Some(rx),
            handle: Some(handle),
        }
    }
}

impl<T> Iterator for Prefetch<T> {
    type Item = T;
    fn next(&mut self) -> Option<T> {
        self.rx.as_ref()?.recv().ok()
    }
}

impl<T> Drop for Prefetch<T> {
    fn drop(&mut self) {
        // Closing the channel first makes a blocked producer return.
        self.rx = None;
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
