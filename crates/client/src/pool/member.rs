//! What the pool needs from one member: an NBD export it can connect to, read, write, zero,
//! trim and flush. The library's `Client` is the member (member_client.rs); the pool's code
//! names only this trait, so it never depends on the type that holds a pool, and its tests
//! use members in memory.

use crate::error::Error;
use crate::export::Export;
use crate::uri::Uri;
use std::future::Future;
use std::pin::Pin;

/// A connection being opened. Boxed: a `Client` connecting to a member is the same async
/// function as one connecting to a pool, and the box ends that type's recursion.
pub(crate) type Connecting<M> = Pin<Box<dyn Future<Output = Result<M, Error>> + Send>>;

pub(crate) trait Member: Clone + Send + Sync + Sized + 'static {
    /// How the caller asked to connect; the member adjusts it for its part in the pool.
    type Options: Clone + Send + Sync + 'static;

    fn connect(uri: &Uri, options: &Self::Options) -> Connecting<Self>;

    /// The export as negotiated: size, read-only, and what it can do (FUA, zero, trim).
    fn export(&self) -> &Export;

    /// Connections open to it.
    fn connections(&self) -> usize;

    fn read(&self, offset: u64, len: usize) -> impl Future<Output = Result<Vec<u8>, Error>> + Send;

    fn write(&self, offset: u64, data: &[u8], fua: bool) -> impl Future<Output = Result<(), Error>> + Send;

    /// Only called when the export can zero.
    fn write_zeroes(&self, offset: u64, len: u64, fua: bool, may_trim: bool) -> impl Future<Output = Result<(), Error>> + Send;

    /// Only called when the export can trim.
    fn trim(&self, offset: u64, len: u64, fua: bool) -> impl Future<Output = Result<(), Error>> + Send;

    fn flush(&self) -> impl Future<Output = Result<(), Error>> + Send;

    fn disconnect(&self) -> impl Future<Output = ()> + Send;
}
