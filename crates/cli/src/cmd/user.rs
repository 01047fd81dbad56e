//! `iris user ...`: per-user budgets and maximum bands (`budget set|get|list`, via the
//! controller) and minting user tokens with the cluster's signing key (`token mint`, local).

use crate::client::{call, controller_client};
use crate::{keys, output, BudgetCmd, TokenCmd, UserCmd};
use iris_proto::cluster::controller as c;

pub(crate) async fn run(cmd: UserCmd, url: Option<String>) -> anyhow::Result<i32> {
    match cmd {
        UserCmd::Token(TokenCmd::Mint(a)) => keys::mint(a),
        UserCmd::Budget(b) => {
            let cl = controller_client(&url)?;
            match b {
                BudgetCmd::Set {
                    user,
                    limit,
                    max_band,
                } => {
                    let band = match max_band {
                        Some(b) => iris_types::Band::parse(&b)
                            .map_err(anyhow::Error::msg)?
                            .code(),
                        None => 0,
                    };
                    let _: c::SetUserBudgetResponse = call(
                        &cl,
                        "SetUserBudget",
                        &c::SetUserBudgetRequest {
                            user_id: user.clone(),
                            budget_limit: limit,
                            max_band: band,
                        },
                    )
                    .await?;
                    println!("Set budget for {user}");
                }
                BudgetCmd::Get { user } => {
                    let r: c::GetUserBudgetResponse = call(
                        &cl,
                        "GetUserBudget",
                        &c::GetUserBudgetRequest { user_id: user },
                    )
                    .await?;
                    output::print_budgets(&[r]);
                }
                BudgetCmd::List => {
                    let r: c::ListUserBudgetsResponse =
                        call(&cl, "ListUserBudgets", &c::ListUserBudgetsRequest {}).await?;
                    output::print_budgets(&r.users);
                }
            }
            Ok(0)
        }
    }
}
