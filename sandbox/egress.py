"""The proxy-only egress rule of a container, applied from outside it (pure text, no IO).

A container in the agent phase sits on its engine's bridge network with no capabilities,
so it cannot change its own firewall. The runner enters only its network namespace
(``nsenter -t <pid> -n``, ``nsenter_argv``) and loads ``proxy_only_ruleset``:

- ``127.0.0.1:<inside_port>`` is DNATed to the proxy's ``address:port`` (and masqueraded
  out of the bridge), so the harness is configured exactly as in bwrap; the kernel routes
  loopback-sourced packets out only with ``route_localnet`` set, which ``ROUTE_LOCALNET``
  does in the same namespace;
- every other packet out, IPv4 or IPv6, to any address or port, is rejected on the spot
  (a TCP reset, else ICMP administratively prohibited: a harness fails fast instead of
  waiting out SYN retries); every packet in that is not loopback or an answer to an
  accepted connection is dropped.

Grading containers need no rule: they run with ``--network none``.
"""

from __future__ import annotations

import ipaddress

ROUTE_LOCALNET = "/proc/sys/net/ipv4/conf/all/route_localnet"


def proxy_only_ruleset(address: str, port: int, inside_port: int) -> str:
    ip = ipaddress.ip_address(address)
    if ip.version != 4 or ip.is_loopback:
        raise ValueError(f"the proxy must be a non-loopback IPv4 address, not {address}")
    return f"""flush ruleset
table ip lego_nat {{
    chain output {{
        type nat hook output priority -100; policy accept;
        ip daddr 127.0.0.1 tcp dport {inside_port} dnat to {ip}:{port}
    }}
    chain postrouting {{
        type nat hook postrouting priority 100; policy accept;
        ip daddr {ip} tcp dport {port} masquerade
    }}
}}
table inet lego_filter {{
    chain output {{
        type filter hook output priority 0; policy drop;
        oif "lo" accept
        ip daddr {ip} tcp dport {port} accept
        meta l4proto tcp reject with tcp reset
        reject with icmpx type admin-prohibited
    }}
    chain input {{
        type filter hook input priority 0; policy drop;
        iif "lo" accept
        ct state established,related accept
    }}
}}
"""


def nsenter_argv(pid: int, *command: str) -> list[str]:
    """``command`` in the network namespace of ``pid`` only (the host's files and tools)."""
    return ["nsenter", "--target", str(pid), "--net", "--", *command]
