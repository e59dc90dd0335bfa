#!/usr/bin/env python3
"""Writes the seed corpus of tests/fuzz/store_protocol.cpp into corpus/store_protocol/.

Each seed is one client conversation in the target's input layout (see the target's header):
the ordinary requests, and the hostile ones of issue 28: requests before or without the secret,
frames that announce 256 MiB and 1 GiB, values that are not integers, a counter driven past
2^63 - 1, counts and lengths the frame cannot hold, too many blocked requests.
"""

import pathlib
import struct

SET, GET, WAIT, ADD, CHECK, ERASE, AUTH = 1, 2, 3, 4, 5, 6, 7
AUTHENTICATED, UNAUTHENTICATED = 1, 0


def frame(code, *fields):
    payload = bytes([code]) + struct.pack("<I", len(fields))
    for f in fields:
        f = f.encode() if isinstance(f, str) else f
        payload += struct.pack("<I", len(f)) + f
    return struct.pack("<I", len(payload)) + payload


def raw(payload):
    return struct.pack("<I", len(payload)) + payload


def seed(flags, *sends):
    """sends: (connection selector, bytes); bytes longer than 255 go in several chunks."""
    out = bytes([flags])
    for selector, data in sends:
        if not data:
            out += bytes([selector, 0])
        for i in range(0, len(data), 255):
            piece = data[i:i + 255]
            out += bytes([selector, len(piece)]) + piece
    return out


SEEDS = {
    "set_get_wait_check_erase": seed(
        AUTHENTICATED,
        (0, frame(GET, "k")),
        (1, frame(SET, "k", "v") + frame(WAIT, "k", "j")),
        (2, frame(SET, "j", b"\0\xff")),
        (0x80 | 1, frame(CHECK, "k", "j") + frame(ERASE, "k") + frame(CHECK))),
    "add_counts": seed(AUTHENTICATED, (0, frame(ADD, "n", "5") + frame(ADD, "n", "-7"))),
    "get_before_authentication": seed(UNAUTHENTICATED, (0, frame(GET, "asynctp/run_id"))),
    "set_before_authentication": seed(UNAUTHENTICATED,
                                      (0, frame(SET, "asynctp/host/1", "attacker"))),
    "wrong_secret": seed(UNAUTHENTICATED, (0, frame(AUTH, b"c" * 16, b"x" * 32))),
    "malformed_authentication": seed(UNAUTHENTICATED, (0, frame(AUTH, b"c" * 3))),
    "authenticate_twice": seed(AUTHENTICATED, (0, frame(AUTH, b"c" * 16, b"x" * 32))),
    "announces_256mib_before_authentication": seed(UNAUTHENTICATED,
                                                   (0, struct.pack("<I", 256 << 20))),
    "announces_1gib_after_authentication": seed(AUTHENTICATED,
                                                (0, struct.pack("<I", (1 << 30) - 1) + b"x")),
    "add_onto_text": seed(AUTHENTICATED, (0, frame(SET, "t", "abc") + frame(ADD, "t", "1"))),
    "add_bad_delta": seed(AUTHENTICATED,
                          (0, frame(ADD, "n", "1x") + frame(ADD, "n", "+1") +
                           frame(ADD, "n", "99999999999999999999"))),
    "add_overflows": seed(AUTHENTICATED,
                          (0, frame(ADD, "n", str(2**63 - 1)) + frame(ADD, "n", "1") +
                           frame(ADD, "m", str(-2**63)) + frame(ADD, "m", "-1"))),
    "count_larger_than_payload": seed(AUTHENTICATED,
                                      (0, raw(bytes([GET]) + struct.pack("<I", 1000)))),
    "count_of_2_31_fields": seed(AUTHENTICATED,
                                 (0, raw(bytes([CHECK]) + struct.pack("<I", 1 << 31)))),
    "field_longer_than_payload": seed(
        AUTHENTICATED, (0, raw(bytes([SET]) + struct.pack("<II", 1, 200) + b"abcd"))),
    "bytes_after_the_last_field": seed(AUTHENTICATED, (0, raw(frame(SET, "k", "v")[4:] + b"junk"))),
    "empty_payload": seed(AUTHENTICATED, (0, struct.pack("<I", 0))),
    "unknown_command": seed(AUTHENTICATED, (0, frame(99, "k"))),
    "wrong_field_counts": seed(AUTHENTICATED,
                               (0, frame(SET, "k")), (1, frame(GET, "a", "b")), (2, frame(WAIT)),
                               (0, frame(ERASE, "a", "b"))),
    "too_many_blocked_gets": seed(AUTHENTICATED, (0, b"".join(frame(GET, "never")
                                                              for _ in range(70)))),
    "waiter_hangs_up": seed(AUTHENTICATED, (0, frame(GET, "k")), (0x40, b""),
                            (1, frame(SET, "k", "v"))),
    "half_a_frame_then_hang_up": seed(AUTHENTICATED, (0, struct.pack("<I", 100) + b"partial"),
                                      (0x40, b"")),
    "slow_reader_pipelines_gets": seed(
        AUTHENTICATED, (0, frame(SET, "big", b"b" * 4000)),
        (1, b"".join(frame(GET, "big") for _ in range(40))), (0x80 | 1, b"")),
}


def main():
    out = pathlib.Path(__file__).resolve().parent / "corpus" / "store_protocol"
    out.mkdir(parents=True, exist_ok=True)
    for name, data in SEEDS.items():
        (out / name).write_bytes(data)
    print(f"{len(SEEDS)} seeds in {out}")


if __name__ == "__main__":
    main()
