from autodeploy.cli.app import main

main()
