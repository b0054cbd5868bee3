"""What the tests share: doubles, builders and in-process stand-ins for real processes."""
