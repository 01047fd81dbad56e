//! Page rendering: pure functions from fetched data to HTML, so they are tested with fixtures.
//!
//! Every page has a static part (heading, forms) and a live part (`div#live`) that the browser
//! refreshes by fetching the same URL with the `x-iris-fragment` header and swapping it in.
//!
//! One module per page or page group (`jobs`, `job`, `task`, `logs`, `workers`, `backends`,
//! `peers`, `scheduler`, `query`), plus `layout`: the document shell and the components every
//! page shares. Everything public is re-exported here.

mod backends;
mod job;
mod jobs;
mod layout;
mod logs;
mod peers;
mod query;
mod scheduler;
mod task;
mod workers;

pub use backends::{backends_page, with_kubernetes};
pub use job::{attempts_from, job_page, Attempts, JobView};
pub use jobs::{jobs_page, state_counts, JobsFilter};
pub use layout::{badge, css_path, error_box, error_page, js_path, layout, Nav, Page};
pub use logs::{log_line, log_list, logs_page, LogsFilter, LogsView};
pub use peers::peers_page;
pub use query::query_page;
pub use scheduler::{scheduler_page, PendingTask};
pub use task::{task_page, TaskView};
pub use workers::workers_page;

/// Jobs shown per page.
pub const JOBS_PER_PAGE: i32 = 50;
/// Tasks shown per page of a job.
pub const TASKS_PER_PAGE: usize = 100;
/// Log lines a page renders at most (the rest stays on the server).
pub const MAX_LOG_LINES: usize = 1000;
/// Query rows rendered at most.
pub const MAX_QUERY_ROWS: usize = 500;
/// Jobs listed per band on the scheduler page.
pub const SCHEDULER_JOBS_PER_BAND: usize = 100;
/// Refresh period of live regions.
pub const REFRESH_MS: u32 = 3000;
