//! Fork-join across cores for one batch: the caller's items split into contiguous parts,
//! the parts run by the pool's threads and the caller itself, and the call returns when every
//! part is done. Order is the caller's to keep: each item is worked on in place, and what
//! happens after (sending, delivering) runs in the batch's order.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::thread;

/// One part of one `for_each` call: a type-erased pointer to the call's frame.
struct Task {
    run: unsafe fn(*const (), usize),
    frame: *const (),
    part: usize,
    done: *const Latch,
}

// SAFETY: a task only points into a `for_each` frame that outlives it (the frame waits for
// its latch), and the items it reaches are Send.
unsafe impl Send for Task {}

#[derive(Default)]
struct Latch {
    left: Mutex<usize>,
    zero: Condvar,
}

impl Latch {
    fn count_down(&self) {
        let mut left = self.left.lock().unwrap_or_else(|e| e.into_inner());
        *left -= 1;
        if *left == 0 {
            self.zero.notify_all();
        }
    }

    fn wait(&self) {
        let mut left = self.left.lock().unwrap_or_else(|e| e.into_inner());
        while *left > 0 {
            left = self.zero.wait(left).unwrap_or_else(|e| e.into_inner());
        }
    }
}

#[derive(Default)]
struct Queue {
    tasks: Mutex<VecDeque<Task>>,
    ready: Condvar,
    closed: std::sync::atomic::AtomicBool,
}

pub struct Pool {
    queue: Arc<Queue>,
    workers: usize,
}

struct Frame<'a, T, F> {
    items: *mut T,
    len: usize,
    parts: usize,
    f: &'a F,
}

fn part_range(len: usize, parts: usize, part: usize) -> (usize, usize) {
    let start = len * part / parts;
    (start, len * (part + 1) / parts)
}

/// Runs part `part` of the frame at `frame`.
///
/// # Safety
/// `frame` points at a live `Frame<T, F>` whose parts are each run once.
unsafe fn run_part<T: Send, F: Fn(&mut T) + Sync>(frame: *const (), part: usize) {
    let frame = &*(frame as *const Frame<'_, T, F>);
    let (start, end) = part_range(frame.len, frame.parts, part);
    // SAFETY: parts are disjoint ranges of the caller's exclusive slice.
    let items = std::slice::from_raw_parts_mut(frame.items.add(start), end - start);
    for item in items {
        (frame.f)(item);
    }
}

impl Pool {
    /// A pool of `workers` threads besides the callers'. 0: everything runs in the caller.
    pub fn new(workers: usize) -> std::io::Result<Pool> {
        let queue = Arc::new(Queue::default());
        for i in 0..workers {
            let q = queue.clone();
            thread::Builder::new()
                .name(format!("crypto-{i}"))
                .spawn(move || loop {
                    let task = {
                        let mut tasks = q.tasks.lock().unwrap_or_else(|e| e.into_inner());
                        loop {
                            if let Some(t) = tasks.pop_front() {
                                break t;
                            }
                            if q.closed.load(std::sync::atomic::Ordering::Relaxed) {
                                return;
                            }
                            tasks = q.ready.wait(tasks).unwrap_or_else(|e| e.into_inner());
                        }
                    };
                    // SAFETY: the frame and latch live until the latch reaches zero.
                    unsafe {
                        (task.run)(task.frame, task.part);
                        (*task.done).count_down();
                    }
                })?;
        }
        Ok(Pool { queue, workers })
    }

    pub fn workers(&self) -> usize {
        self.workers
    }

    /// Calls `f` on every item; with at least `min_part` items per part, the items are
    /// split across the pool's threads and the caller's.
    pub fn for_each<T: Send, F: Fn(&mut T) + Sync>(&self, items: &mut [T], min_part: usize, f: F) {
        let parts = (self.workers + 1).min(items.len() / min_part.max(1)).max(1);
        if parts == 1 {
            items.iter_mut().for_each(f);
            return;
        }
        let frame = Frame {
            items: items.as_mut_ptr(),
            len: items.len(),
            parts,
            f: &f,
        };
        let latch = Latch {
            left: Mutex::new(parts - 1),
            zero: Condvar::new(),
        };
        let frame_ptr = &frame as *const Frame<'_, T, F> as *const ();
        {
            let mut tasks = self.queue.tasks.lock().unwrap_or_else(|e| e.into_inner());
            for part in 1..parts {
                tasks.push_back(Task {
                    run: run_part::<T, F>,
                    frame: frame_ptr,
                    part,
                    done: &latch,
                });
            }
        }
        for _ in 1..parts {
            self.queue.ready.notify_one();
        }
        // The waiting below must happen even if a part panics here.
        struct Wait<'a>(&'a Latch, &'a Queue, *const ());
        impl Drop for Wait<'_> {
            fn drop(&mut self) {
                // Parts no worker took yet are run here rather than waited for.
                loop {
                    let mine = {
                        let mut tasks = self.1.tasks.lock().unwrap_or_else(|e| e.into_inner());
                        let at = tasks.iter().position(|t| t.frame == self.2);
                        at.and_then(|i| tasks.remove(i))
                    };
                    let Some(t) = mine else { break };
                    // SAFETY: the frame is alive: this guard lives in its scope.
                    unsafe {
                        (t.run)(t.frame, t.part);
                    }
                    self.0.count_down();
                }
                self.0.wait();
            }
        }
        let _wait = Wait(&latch, &self.queue, frame_ptr);
        // SAFETY: part 0 is run only here; the frame is alive.
        unsafe { run_part::<T, F>(frame_ptr, 0) };
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let _tasks = self.queue.tasks.lock().unwrap_or_else(|e| e.into_inner());
        self.queue
            .closed
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.queue.ready.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_item_is_worked_on_once_in_place_whatever_the_split() {
        for workers in [0, 1, 3] {
            let pool = Pool::new(workers).unwrap();
            for len in [0, 1, 5, 64, 1000] {
                let mut items: Vec<u64> = (0..len).collect();
                pool.for_each(&mut items, 4, |x| *x = *x * 2 + 1);
                let want: Vec<u64> = (0..len).map(|x| x * 2 + 1).collect();
                assert_eq!(items, want, "{workers} workers, {len} items");
            }
        }
    }

    #[test]
    fn callers_on_several_threads_share_the_pool() {
        let pool = Arc::new(Pool::new(2).unwrap());
        let handles: Vec<_> = (0..4)
            .map(|t| {
                let pool = pool.clone();
                thread::spawn(move || {
                    for round in 0..200u64 {
                        let mut items: Vec<u64> = (0..100).collect();
                        pool.for_each(&mut items, 10, |x| *x += t * 1000 + round);
                        assert!(items
                            .iter()
                            .enumerate()
                            .all(|(i, x)| *x == i as u64 + t * 1000 + round));
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }
}
