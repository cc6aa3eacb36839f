"""Launch the job templates of awx/ through ansible-runner, the way AWX does (see launcher/README.md)."""
