"""Operations: remote commands on fleet machines, queue health, ad-hoc task calls and worker logs."""
