//! `iris query`: read-only SQL over the controller DB (`ExecuteRawQuery`), printed as a table,
//! CSV or JSON.

use crate::client::{call, controller_client};
use crate::output;

pub(crate) async fn run(sql: String, format: &str, url: Option<String>) -> anyhow::Result<i32> {
    let cl = controller_client(&url)?;
    let r: iris_proto::query::RawQueryResponse = call(
        &cl,
        "ExecuteRawQuery",
        &iris_proto::query::RawQueryRequest { sql },
    )
    .await?;
    output::print_query(&r, format)?;
    Ok(0)
}
