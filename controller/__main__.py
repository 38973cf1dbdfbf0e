from controller.cli.app import main

main()
