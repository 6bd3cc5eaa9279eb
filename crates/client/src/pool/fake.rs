//! A member in memory for the driver's tests: it records every call and can be told to
//! fail the next one. A fake `listen`ing at a URI is what `connect` to that URI finds
//! (the cache's tests connect their members that way); nothing else connects.

use super::member::{Connecting, Member};
use crate::error::Error;
use crate::export::Export;
use crate::uri::Uri;
use sluice_proto::wire::*;
use std::future::Future;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Fakes by the URI they `listen` at.
static LISTENING: Mutex<Option<HashMap<String, Fake>>> = Mutex::new(None);

/// `connect` calls by URI, listening or not.
static CONNECTS: Mutex<Option<HashMap<String, usize>>> = Mutex::new(None);

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Call {
    Read { offset: u64, len: usize },
    Write { offset: u64, len: usize, fua: bool },
    Zero { offset: u64, len: u64, fua: bool, may_trim: bool },
    Trim { offset: u64, len: u64, fua: bool },
    Flush,
}

#[derive(Default)]
struct State {
    data: Vec<u8>,
    calls: Vec<Call>,
    fail_next: bool,
    /// The next call panics, as a bug in the code under a member would.
    panic_next: bool,
    /// `disconnect` never returns, as on a stalled server whose socket buffer is full.
    stall_disconnect: bool,
    /// Reads still to return with their first byte after the magic flipped, as a read that
    /// raced a write of the same block would.
    torn_reads: usize,
}

#[derive(Clone)]
pub(crate) struct Fake {
    export: Export,
    state: Arc<Mutex<State>>,
}

impl Fake {
    pub(crate) fn new(size: u64, fua: bool, zero: bool, trim: bool) -> Fake {
        let mut flags = FLAG_HAS_FLAGS | FLAG_SEND_FLUSH;
        for (on, f) in [(fua, FLAG_SEND_FUA), (zero, FLAG_SEND_WRITE_ZEROES), (trim, FLAG_SEND_TRIM)] {
            if on {
                flags |= f;
            }
        }
        let export = Export {
            name: "fake".into(),
            description: None,
            size,
            flags,
            block_min: 1,
            block_preferred: 4096,
            block_max: 32 << 20,
            structured: true,
            extended: false,
            base_allocation: false,
            tls: None,
        };
        let state = State { data: vec![0; size as usize], ..State::default() };
        Fake { export, state: Arc::new(Mutex::new(state)) }
    }

    pub(crate) fn with_flags(mut self, flags: u16, block_min: u32) -> Fake {
        self.export.flags |= flags;
        self.export.block_min = block_min;
        self
    }

    pub(crate) fn calls(&self) -> Vec<Call> {
        self.state.lock().unwrap().calls.clone()
    }

    pub(crate) fn bytes(&self, offset: u64, len: usize) -> Vec<u8> {
        self.state.lock().unwrap().data[offset as usize..][..len].to_vec()
    }

    pub(crate) fn fill(&self, byte: u8) {
        self.state.lock().unwrap().data.fill(byte);
    }

    pub(crate) fn put(&self, offset: u64, bytes: &[u8]) {
        self.state.lock().unwrap().data[offset as usize..][..bytes.len()].copy_from_slice(bytes);
    }

    /// `connect` to `uri` finds this fake from now on (a clone: the same data).
    pub(crate) fn listen(&self, uri: &str) {
        LISTENING.lock().unwrap().get_or_insert_with(HashMap::new).insert(uri.to_owned(), self.clone());
    }

    /// `connect` to `uri` fails from now on.
    pub(crate) fn unlisten(uri: &str) {
        LISTENING.lock().unwrap().get_or_insert_with(HashMap::new).remove(uri);
    }

    /// How many times `connect` was called for `uri` so far.
    pub(crate) fn connects(uri: &str) -> usize {
        CONNECTS.lock().unwrap().as_ref().and_then(|c| c.get(uri).copied()).unwrap_or(0)
    }

    pub(crate) fn fail_next(&self) {
        self.state.lock().unwrap().fail_next = true;
    }

    /// Handles to this fake (its clones) alive now: the test's, the listener's, and those
    /// the code under test holds.
    pub(crate) fn handles(&self) -> usize {
        Arc::strong_count(&self.state)
    }

    pub(crate) fn stall_disconnect(&self) {
        self.state.lock().unwrap().stall_disconnect = true;
    }

    pub(crate) fn panic_next(&self) {
        self.state.lock().unwrap().panic_next = true;
    }

    pub(crate) fn tear_next_reads(&self, n: usize) {
        self.state.lock().unwrap().torn_reads = n;
    }

    /// Records the call, fails it if told to, else applies `f` to the data.
    fn serve<T>(&self, call: Call, f: impl FnOnce(&mut Vec<u8>) -> T) -> Result<T, Error> {
        let mut st = self.state.lock().unwrap();
        if std::mem::take(&mut st.panic_next) {
            drop(st);
            panic!("told to panic");
        }
        if std::mem::take(&mut st.fail_next) {
            return Err(Error::Server { errno: 5, message: Some("told to fail".into()) });
        }
        st.calls.push(call);
        Ok(f(&mut st.data))
    }
}

impl Member for Fake {
    type Options = ();

    fn connect(uri: &Uri, _: &()) -> Connecting<Fake> {
        *CONNECTS.lock().unwrap().get_or_insert_with(HashMap::new).entry(uri.to_string()).or_default() += 1;
        let found = LISTENING.lock().unwrap().as_ref().and_then(|l| l.get(&uri.to_string()).cloned());
        Box::pin(async move { found.ok_or(Error::Closed) })
    }

    fn export(&self) -> &Export {
        &self.export
    }

    fn connections(&self) -> usize {
        1
    }

    fn read(&self, offset: u64, len: usize) -> impl Future<Output = Result<Vec<u8>, Error>> + Send {
        let r = self.serve(Call::Read { offset, len }, |d| d[offset as usize..][..len].to_vec());
        let r = r.map(|mut bytes| {
            let mut st = self.state.lock().unwrap();
            if st.torn_reads > 0 && bytes.len() > 8 {
                st.torn_reads -= 1;
                bytes[8] ^= 0xff;
            }
            bytes
        });
        async move { r }
    }

    fn write(&self, offset: u64, data: &[u8], fua: bool) -> impl Future<Output = Result<(), Error>> + Send {
        let r = self.serve(Call::Write { offset, len: data.len(), fua }, |d| d[offset as usize..][..data.len()].copy_from_slice(data));
        async move { r }
    }

    fn write_zeroes(&self, offset: u64, len: u64, fua: bool, may_trim: bool) -> impl Future<Output = Result<(), Error>> + Send {
        let r = self.serve(Call::Zero { offset, len, fua, may_trim }, |d| d[offset as usize..][..len as usize].fill(0));
        async move { r }
    }

    fn trim(&self, offset: u64, len: u64, fua: bool) -> impl Future<Output = Result<(), Error>> + Send {
        let r = self.serve(Call::Trim { offset, len, fua }, |_| ());
        async move { r }
    }

    fn flush(&self) -> impl Future<Output = Result<(), Error>> + Send {
        let r = self.serve(Call::Flush, |_| ());
        async move { r }
    }

    async fn disconnect(&self) {
        if self.state.lock().unwrap().stall_disconnect {
            std::future::pending::<()>().await;
        }
    }
}
