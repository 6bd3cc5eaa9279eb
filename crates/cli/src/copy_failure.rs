//! Why `sluice copy` stopped: a message and the exit status that goes with it. Every part
//! of the copy (planning, reading, writing) returns one, so it sits below all of them.

use crate::client_cli::exit_code;
use crate::exit::EXIT_FAILURE;
use sluice_client::Error;

/// Why the copy stopped, and the exit status that says so.
pub(crate) struct Failure {
    pub(crate) code: u8,
    pub(crate) message: String,
}

impl Failure {
    pub(crate) fn new(message: impl Into<String>) -> Failure {
        Failure {
            code: EXIT_FAILURE,
            message: message.into(),
        }
    }

    /// A client error, with what was being done; a bad URI keeps its usage status.
    pub(crate) fn client(context: &str, e: &Error) -> Failure {
        Failure {
            code: exit_code(e),
            message: format!("{context}: {e}"),
        }
    }

    pub(crate) fn io(context: &str, e: std::io::Error) -> Failure {
        Failure::new(format!("{context}: {e}"))
    }
}
