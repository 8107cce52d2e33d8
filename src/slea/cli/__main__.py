from slea.cli.main import main

main()
