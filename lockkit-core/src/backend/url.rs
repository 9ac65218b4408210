//! Connection URLs with several hosts (`etcd://h1:2379,h2:2379/ns`), which general URL
//! parsers refuse. Shared by the facade and every backend.

use std::fmt;

use percent_encoding::percent_decode_str;

use crate::error::{Error, Result};

/// One `host[:port]` of a [`ConnectionUrl`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPort {
    /// Host name or address (IPv6 without brackets).
    pub host: String,
    /// The port, if given.
    pub port: Option<u16>,
}

impl fmt::Display for HostPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        match self.port {
            Some(port) => write!(f, "{host}:{port}"),
            None => f.write_str(&host),
        }
    }
}

/// A parsed `scheme://[user[:password]@]host[:port][,host[:port]...][/path][?key=value&...]`.
///
/// User, password, path and query values are percent-decoded. The password is redacted in
/// `Debug` and in `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct ConnectionUrl {
    /// The scheme, lowercased (`"redis"`, `"etcd"`, ...).
    pub scheme: String,
    /// The user name, if any.
    pub username: Option<String>,
    /// The password, if any. Never logged.
    pub password: Option<String>,
    /// The hosts, in order. May be empty (`memory://`).
    pub hosts: Vec<HostPort>,
    /// The path without its leading `/`, decoded; empty when absent.
    pub path: String,
    /// The query parameters, decoded, in order.
    pub query: Vec<(String, String)>,
}

impl ConnectionUrl {
    /// Parses `url`.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidConfig`](crate::ErrorKind::InvalidConfig) saying what is malformed;
    /// the message never repeats the password.
    pub fn parse(url: &str) -> Result<Self> {
        let bad =
            |why: &str| Error::invalid_config(format!("malformed URL {}: {why}", redact(url)));
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| bad("expected scheme://..."))?;
        if scheme.is_empty()
            || !scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        {
            return Err(bad("invalid scheme"));
        }
        let (rest, query) = match rest.split_once('?') {
            Some((rest, query)) => (rest, Some(query)),
            None => (rest, None),
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, ""),
        };
        // An `@` after the hosts almost always ends a password holding an unencoded `/` or
        // `?`: parsed as written, pieces of the password would become a host or a path and
        // show up in later messages. Refuse it; a literal `@` there is written `%40`.
        if path.contains('@') || query.is_some_and(|q| q.contains('@')) {
            return Err(bad(
                "'@' after the hosts: percent-encode '/', '?' and '@' in a user or password (%2F, %3F, %40)",
            ));
        }
        let (userinfo, hosts) = match authority.rfind('@') {
            Some(i) => (Some(&authority[..i]), &authority[i + 1..]),
            None => (None, authority),
        };
        let (username, password) = match userinfo {
            None => (None, None),
            Some(info) => {
                let (user, pass) = match info.split_once(':') {
                    Some((user, pass)) => (user, Some(pass)),
                    None => (info, None),
                };
                let user = decode(user).map_err(|_| bad("user is not valid UTF-8"))?;
                let pass = pass
                    .map(decode)
                    .transpose()
                    .map_err(|_| bad("password is not valid UTF-8"))?;
                ((!user.is_empty()).then_some(user), pass)
            }
        };
        let hosts = if hosts.is_empty() {
            Vec::new()
        } else {
            hosts
                .split(',')
                .map(|h| parse_host(h).map_err(|why| bad(&why)))
                .collect::<Result<_>>()?
        };
        let query = query
            .unwrap_or("")
            .split('&')
            .filter(|pair| !pair.is_empty())
            .map(|pair| {
                let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                Ok((
                    decode(k).map_err(|_| bad("query is not valid UTF-8"))?,
                    decode(v).map_err(|_| bad("query is not valid UTF-8"))?,
                ))
            })
            .collect::<Result<_>>()?;
        Ok(ConnectionUrl {
            scheme: scheme.to_ascii_lowercase(),
            username,
            password,
            hosts,
            path: decode(path).map_err(|_| bad("path is not valid UTF-8"))?,
            query,
        })
    }

    /// The hosts as `host:port` (IPv6 in brackets), with `default_port` where the URL gives
    /// none.
    pub fn hosts_with_port(&self, default_port: u16) -> Vec<String> {
        self.hosts
            .iter()
            .map(|h| {
                HostPort {
                    host: h.host.clone(),
                    port: h.port.or(Some(default_port)),
                }
                .to_string()
            })
            .collect()
    }

    /// The value of query parameter `key`, if present.
    pub fn query_value(&self, key: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

fn decode(s: &str) -> std::result::Result<String, std::str::Utf8Error> {
    percent_decode_str(s).decode_utf8().map(|c| c.into_owned())
}

fn parse_host(h: &str) -> std::result::Result<HostPort, String> {
    let (host, port) = if let Some(rest) = h.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or("unclosed '[' in host")?;
        match after {
            "" => (host, None),
            _ => (host, Some(after.strip_prefix(':').ok_or("junk after ']'")?)),
        }
    } else {
        match h.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (h, None),
        }
    };
    if host.is_empty() {
        return Err("empty host".into());
    }
    if host
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || matches!(c, '/' | '@' | '?' | '#'))
    {
        return Err(format!("invalid host {host:?}"));
    }
    let port = port
        .map(|p| {
            p.parse::<u16>()
                .map_err(|_| format!("invalid port {p:?} for host {host}"))
        })
        .transpose()?;
    Ok(HostPort {
        host: host.to_owned(),
        port,
    })
}

/// `url` with any password replaced by `***`, for messages.
///
/// Everything between `://` and the *last* `@` counts as user and password, even past a `/`
/// or `?`: a password with an unencoded `/`, `?` or `@` (common in generated passwords) must
/// not show up in the message that reports the URL malformed. That over-redacts the rare
/// URL with an `@` in its path, which is harmless in a message.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    match rest.rfind('@') {
        Some(at) => match rest[..at].split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***{}", &rest[at..]),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

impl fmt::Display for ConnectionUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://", self.scheme)?;
        match (&self.username, &self.password) {
            (Some(user), Some(_)) => write!(f, "{user}:***@")?,
            (None, Some(_)) => f.write_str(":***@")?,
            (Some(user), None) => write!(f, "{user}@")?,
            (None, None) => {}
        }
        let hosts: Vec<String> = self.hosts.iter().map(ToString::to_string).collect();
        f.write_str(&hosts.join(","))?;
        if !self.path.is_empty() {
            write!(f, "/{}", self.path)?;
        }
        Ok(())
    }
}

impl fmt::Debug for ConnectionUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectionUrl")
            .field("scheme", &self.scheme)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("hosts", &self.hosts)
            .field("path", &self.path)
            .field("query", &self.query)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_several_hosts_user_path_and_query() {
        let url =
            ConnectionUrl::parse("etcd://root:p%40ss@h1:2379,h2,[::1]:2381/my%20ns?timeout=2s&tls")
                .expect("parse");
        assert_eq!(url.scheme, "etcd");
        assert_eq!(url.username.as_deref(), Some("root"));
        assert_eq!(url.password.as_deref(), Some("p@ss"));
        assert_eq!(url.hosts.len(), 3);
        assert_eq!(
            url.hosts[0],
            HostPort {
                host: "h1".into(),
                port: Some(2379)
            }
        );
        assert_eq!(url.hosts[1].port, None);
        assert_eq!(url.hosts[2].host, "::1");
        assert_eq!(url.path, "my ns");
        assert_eq!(url.query_value("timeout"), Some("2s"));
        assert_eq!(url.query_value("tls"), Some(""));
        assert_eq!(
            url.hosts_with_port(2379),
            vec!["h1:2379", "h2:2379", "[::1]:2381"]
        );
    }

    #[test]
    fn passwords_never_show() {
        let url = ConnectionUrl::parse("redis://u:hunter2@h:1").expect("parse");
        assert!(!format!("{url:?}").contains("hunter2"));
        assert!(!url.to_string().contains("hunter2"));
        let err = ConnectionUrl::parse("redis://u:hunter2@h:notaport").unwrap_err();
        assert!(!err.to_string().contains("hunter2"), "{err}");
        assert_eq!(redact("redis://u:hunter2@h:1/0"), "redis://u:***@h:1/0");
    }

    #[test]
    fn unencoded_slash_question_mark_or_at_in_a_password_never_reaches_a_message() {
        for url in [
            "redis://:Zm9v/YmFy+cXV4@h:6379/0",
            "redis://u:1234/5678@h",
            "etcd://u:qwer?tyui@h1,h2",
            "redis://u:zxcv@bnml/poiu@h",
            "zk://u:lkjh?x=1@h/chroot",
        ] {
            let secret = &url[url.find(':').map_or(0, |i| i + 3)..url.rfind('@').unwrap_or(0)];
            let secret = secret.split_once(':').map_or(secret, |(_, p)| p);
            let err = ConnectionUrl::parse(url).expect_err(url);
            assert_eq!(err.kind(), crate::ErrorKind::InvalidConfig, "{url}");
            for shown in [err.to_string(), format!("{err:?}"), redact(url)] {
                assert!(!shown.contains(secret), "{url}: {shown}");
                for piece in secret.split(['/', '?', '@']).filter(|p| p.len() > 3) {
                    assert!(!shown.contains(piece), "{url}: {piece:?} in {shown}");
                }
            }
        }
        let url = ConnectionUrl::parse("redis://:Zm9v%2FYmFy%3F%40@h/0").expect("encoded");
        assert_eq!(url.password.as_deref(), Some("Zm9v/YmFy?@"));
        assert_eq!(url.path, "0");
        assert_eq!(
            ConnectionUrl::parse("etcd://h/pre%40fix").expect("ok").path,
            "pre@fix"
        );
    }

    #[test]
    fn malformed_urls_are_typed_errors() {
        for bad in [
            "",
            "nohost",
            "redis:/x",
            "://h",
            "re dis://h",
            "redis://h:99999",
            "redis://h1,,h2",
            "redis://[::1",
        ] {
            let err = ConnectionUrl::parse(bad).expect_err(bad);
            assert_eq!(err.kind(), crate::ErrorKind::InvalidConfig, "{bad}");
        }
        assert!(
            ConnectionUrl::parse("memory://")
                .expect("empty")
                .hosts
                .is_empty()
        );
    }
}
