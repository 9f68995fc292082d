"""What the tests share: model builders, the CLI runner, the SSH and emulated-device fixtures."""
