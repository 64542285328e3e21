//! Step 3 of a pass, keep: the Secrets the operator owns for the cluster, written when they
//! must be: its credentials (created if absent, moved from an older layout, a rotation's steps:
//! [`credentials`]) and the passwords issued to its config's users that bring none
//! ([`issued`]). The logins go into the reach read in step 2, behind the leadership fence.

use crate::controller::build::render::ClusterRender;
use crate::controller::build::status::Reason;
use crate::controller::error::Error;
use crate::controller::events::{ClusterEvent, publish};
use crate::controller::lead::fence;
use crate::controller::memory::credentials::Read;
use crate::controller::pass::issued::IssuedHashes;
use crate::controller::pass::read::Reads;
use crate::controller::pass::secrets::PasswordHashes;
use crate::controller::pass::{Halt, Pass, credentials, issued};
use crate::controller::view::ClusterNodes;
use crate::credentials::secret_name;
use crate::valkey::Reach;

/// What steps 2 and 3 know of the cluster, but its nodes (the host takes those).
pub struct Seen {
    /// How the operator reaches the nodes: the TLS trust, its logins, the leadership fence.
    pub reach: Reach,
    /// The versions of the TLS Secrets the nodes mount, for reloads.
    pub certificate: Option<String>,
    /// The credentials as the Secret holds them, and whether a rotation was asked for.
    pub login: Read,
    /// The users' passwords, hashed at once.
    pub passwords: PasswordHashes,
    /// The hashes of the passwords issued to the config's users for this cluster.
    pub issued: IssuedHashes,
}

/// Keeps the cluster's credentials and issued passwords; credentials that cannot be used (a
/// Secret of that name the operator does not own, or one it cannot read) stop the pass.
pub async fn keep(
    pass: &Pass<'_>,
    render: &ClusterRender<'_>,
    nodes: &ClusterNodes,
    reads: Reads,
) -> Result<Seen, Halt> {
    let (ctx, cluster, namespace) = (pass.ctx, pass.cluster, &pass.namespace);
    let secret = secret_name(&pass.key.name);
    let started_with_it = nodes.pods.values().any(|pod| pod.mounts(&secret));
    let login = match credentials::ensure(ctx, render, namespace, started_with_it).await {
        Ok(login) => login,
        Err(error @ (Error::NotOurs { .. } | Error::Credentials { .. })) => {
            let problem = error.to_string();
            if matches!(error, Error::NotOurs { .. }) {
                let event = ClusterEvent::NameConflict {
                    problem: problem.clone(),
                };
                publish(&ctx.recorder, cluster, &event).await;
            }
            return Err(Halt::Waiting {
                reason: Reason::CredentialsUnusable,
                message: problem,
            });
        }
        Err(error) => return Err(error.into()),
    };
    let mut reach = reads.reach;
    reach.credentials = login.credentials.logins();
    reach.fence = Some(fence::valkey_fence(&ctx.leadership));
    let issued = issued::ensure(ctx, render, namespace).await?;
    Ok(Seen {
        reach,
        certificate: reads.certificate,
        login,
        passwords: reads.passwords,
        issued,
    })
}
