//! The library's `Client` as a pool member.

use super::member::{Connecting, Member};
use crate::client::Client;
use crate::error::Error;
use crate::export::Export;
use crate::limits::POOL_MEMBER_CONNECTIONS;
use crate::options::Options;
use crate::uri::Uri;
use std::future::Future;

impl Member for Client {
    type Options = Options;

    fn connect(uri: &Uri, options: &Options) -> Connecting<Client> {
        let uri = uri.clone();
        // Every caller of the pool shares its members, so each member gets several
        // connections when it allows them; the pool reports no allocation, so members
        // need not negotiate it. A member never reconnects by itself: the coordinator must
        // see it go, or writes it missed would go unnoticed.
        let options = Options {
            connections: options.connections.max(POOL_MEMBER_CONNECTIONS),
            block_status: false,
            reconnect: None,
            ..options.clone()
        };
        Box::pin(async move { Client::connect_with(&uri, &options).await })
    }

    fn export(&self) -> &Export {
        Client::export(self)
    }

    fn connections(&self) -> usize {
        Client::connections(self)
    }

    fn read(&self, offset: u64, len: usize) -> impl Future<Output = Result<Vec<u8>, Error>> + Send {
        self.read_owned(offset, crate::read_buffers::take(len))
    }

    fn write(&self, offset: u64, data: &[u8], fua: bool) -> impl Future<Output = Result<(), Error>> + Send {
        Client::write(self, offset, data, fua)
    }

    fn write_zeroes(&self, offset: u64, len: u64, fua: bool, may_trim: bool) -> impl Future<Output = Result<(), Error>> + Send {
        Client::write_zeroes(self, offset, len, fua, may_trim, false)
    }

    fn trim(&self, offset: u64, len: u64, fua: bool) -> impl Future<Output = Result<(), Error>> + Send {
        Client::trim(self, offset, len, fua)
    }

    fn flush(&self) -> impl Future<Output = Result<(), Error>> + Send {
        Client::flush(self)
    }

    fn disconnect(&self) -> impl Future<Output = ()> + Send {
        // Boxed: a pool client's disconnect disconnects its members, so the future would
        // otherwise contain itself.
        Box::pin(Client::disconnect(self))
    }
}
